//! The models a module image holds, as its own worker lists them at the startup proof
//! (`sim-worker --list`: one line `<id> params=<n> outputs=<m>` per model).
//!
//! The list comes from the image the proof just verified, through the runner's authenticated
//! report; it still is parsed strictly, and a line that does not parse fails the proof.

use std::collections::BTreeMap;

/// One model's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Parameters per row.
    pub params: u32,
    /// Outputs per step.
    pub outputs: u32,
}

/// The models of one module image, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue(BTreeMap<String, Shape>);

impl Catalogue {
    /// Parses `sim-worker --list` output; the error names the first line that is off.
    pub fn parse(listing: &str) -> Result<Catalogue, String> {
        let mut models = BTreeMap::new();
        for line in listing.lines() {
            let shape = parse_line(line).ok_or_else(|| format!("unexpected line {line:?}"))?;
            if models.insert(shape.0.to_owned(), shape.1).is_some() {
                return Err(format!("model {} is listed twice", shape.0));
            }
        }
        if models.is_empty() {
            return Err("the image holds no model".into());
        }
        Ok(Catalogue(models))
    }

    /// The shape of model `id`, if the image holds it.
    pub fn get(&self, id: &str) -> Option<Shape> {
        self.0.get(id).copied()
    }

    /// The model ids, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

fn parse_line(line: &str) -> Option<(&str, Shape)> {
    let mut words = line.split(' ');
    let id = words
        .next()
        .filter(|id| plimsoll::validate::is_model_name(id))?;
    let count = |word: Option<&str>, key: &str| -> Option<u32> {
        let n: u32 = word?.strip_prefix(key)?.parse().ok()?;
        (1..=sim_format::MAX_WIDTH as u32).contains(&n).then_some(n)
    };
    let params = count(words.next(), "params=")?;
    let outputs = count(words.next(), "outputs=")?;
    words
        .next()
        .is_none()
        .then_some((id, Shape { params, outputs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_parses_strictly() {
        let c = Catalogue::parse("bouncing-ball params=4 outputs=3\nspin params=1 outputs=1\n")
            .unwrap();
        assert_eq!(
            c.get("bouncing-ball"),
            Some(Shape {
                params: 4,
                outputs: 3
            })
        );
        assert_eq!(c.ids().collect::<Vec<_>>(), ["bouncing-ball", "spin"]);
        for bad in [
            "",
            "x params=1",
            "x params=1 outputs=0",
            "x params=65 outputs=1",
            "x params=1 outputs=1 extra",
            "../x params=1 outputs=1",
            "x params=1 outputs=1\nx params=2 outputs=2",
        ] {
            assert!(Catalogue::parse(bad).is_err(), "{bad:?}");
        }
    }
}
