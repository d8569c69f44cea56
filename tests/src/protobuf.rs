//! Just enough protobuf to read answers and write small requests by hand.
//!
//! Fields come back in wire order as `(number, Field)`; a test picks what it checks.
//! Deliberately independent of the daemon's generated code.

/// One decoded field value, by wire type.
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    Varint(u64),
    Fixed64(u64),
    Bytes(Vec<u8>),
    Fixed32(u32),
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or("truncated varint")?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint longer than 10 bytes".into())
}

fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = at
        .checked_add(n)
        .filter(|e| *e <= bytes.len())
        .ok_or("truncated field")?;
    let out = &bytes[*at..end];
    *at = end;
    Ok(out)
}

/// Decodes one message's fields, in order.
pub fn decode(bytes: &[u8]) -> Result<Vec<(u32, Field)>, String> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let number = u32::try_from(key >> 3).map_err(|_| "field number too large")?;
        if number == 0 {
            return Err("field number 0".into());
        }
        let field = match key & 7 {
            0 => Field::Varint(varint(bytes, &mut at)?),
            1 => {
                let b = take(bytes, &mut at, 8)?;
                Field::Fixed64(u64::from_le_bytes(b.try_into().map_err(|_| "fixed64")?))
            }
            2 => {
                let n = usize::try_from(varint(bytes, &mut at)?).map_err(|_| "length")?;
                Field::Bytes(take(bytes, &mut at, n)?.to_vec())
            }
            5 => {
                let b = take(bytes, &mut at, 4)?;
                Field::Fixed32(u32::from_le_bytes(b.try_into().map_err(|_| "fixed32")?))
            }
            t => return Err(format!("unsupported wire type {t}")),
        };
        out.push((number, field));
    }
    Ok(out)
}

/// The last value of a length-delimited field, as UTF-8 text.
pub fn string(fields: &[(u32, Field)], number: u32) -> Option<String> {
    bytes(fields, number).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The last value of a length-delimited field.
pub fn bytes(fields: &[(u32, Field)], number: u32) -> Option<Vec<u8>> {
    fields.iter().rev().find_map(|(n, f)| match f {
        Field::Bytes(b) if *n == number => Some(b.clone()),
        _ => None,
    })
}

/// Every value of a repeated length-delimited field.
pub fn all_bytes(fields: &[(u32, Field)], number: u32) -> Vec<Vec<u8>> {
    fields
        .iter()
        .filter_map(|(n, f)| match f {
            Field::Bytes(b) if *n == number => Some(b.clone()),
            _ => None,
        })
        .collect()
}

/// The last value of a varint field.
pub fn uint(fields: &[(u32, Field)], number: u32) -> Option<u64> {
    fields.iter().rev().find_map(|(n, f)| match f {
        Field::Varint(v) if *n == number => Some(*v),
        _ => None,
    })
}

// === encoding ===

/// Appends a varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a varint field.
pub fn put_uint(out: &mut Vec<u8>, number: u32, v: u64) {
    put_varint(out, u64::from(number) << 3);
    put_varint(out, v);
}

/// Appends a length-delimited field.
pub fn put_bytes(out: &mut Vec<u8>, number: u32, v: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | 2);
    put_varint(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// A gRPC (and gRPC-Web) length-prefixed message frame, uncompressed.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    let len = u32::try_from(message.len()).expect("a test message fits a frame");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Splits a gRPC-Web body into `(flags, payload)` frames.
pub fn grpc_frames(mut body: &[u8]) -> Result<Vec<(u8, Vec<u8>)>, String> {
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 5 {
            return Err("truncated frame header".into());
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let end = 5usize
            .checked_add(len)
            .filter(|e| *e <= body.len())
            .ok_or("truncated frame")?;
        out.push((body[0], body[5..end].to_vec()));
        body = &body[end..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_it_encodes() {
        let mut m = Vec::new();
        put_uint(&mut m, 9, 4);
        put_bytes(&mut m, 1, b"disabled");
        put_uint(&mut m, 1, 300);
        let f = decode(&m).unwrap();
        assert_eq!(uint(&f, 9), Some(4));
        assert_eq!(string(&f, 1).as_deref(), Some("disabled"));
        assert_eq!(uint(&f, 1), Some(300));
    }

    #[test]
    fn not_dispatched_isolation_is_08_05() {
        let mut m = Vec::new();
        put_uint(&mut m, 1, 5);
        assert_eq!(m, [0x08, 0x05]);
    }

    #[test]
    fn truncated_input_is_an_error() {
        assert!(decode(&[0x0a, 0x05, b'a']).is_err());
        assert!(decode(&[0x08]).is_err());
    }
}
