//! The software identity of an image: `oci-manifest:<platform>@sha256:<64 hex>`, the manifest
//! docker verified for it and the platform it runs (wire.md §6.3, providers.md §5.11 step 11).
//! A caller's software rule (`exact`, `approved`) is checked against it before dispatch, and
//! every record of a run in the image states it.
//!
//! Only what docker itself recorded is used, read from the same whole-object inspection that
//! fixed the image's content id, so the identity and the id cannot come from two moments:
//! - on the classic image store, the image's **repo digests**: docker records one when it pulls
//!   an image by digest (after checking the manifest's bytes against it and the manifest's
//!   config against the image id) and when it pushes one. `images/build` pushes every image to
//!   a loopback registry and pulls it back by digest for exactly this. A reference pinned as
//!   `name@sha256:…` states its own digest; otherwise the image's repo digests must name one
//!   digest (or exactly one within the reference's repository);
//! - on the containerd image store, the image's target **descriptor**, when it is a single
//!   image manifest (OCI or Docker v2). An index (a multi-platform image) is not a manifest,
//!   and this provider does not select one of its entries.
//!
//! Anything else (an image imported or built locally and never pushed, two candidate digests,
//! an index, a platform docker does not state) leaves the identity empty. An empty identity
//! never satisfies a rule: the run is refused, never matched against a guess.
//!
//! On the classic store, an image pulled through a multi-platform index by tag records the
//! index's digest; that is what it states then (a content address that, with the platform,
//! names one manifest), so a rule meant for it names that digest.

use bollard::models::{ImageInspect, OciPlatform};

/// Every identity starts so.
const PREFIX: &str = "oci-manifest:";
/// The media types of one image manifest (an index or a manifest list is not one).
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// The longest identity a software rule can name (wire.md §6.3).
const MAX_IDENTITY: usize = 256;

/// Which image store the Engine keeps images in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageStore {
    /// The graph-driver store (overlay2 and the like): manifests are not kept, repo digests are.
    Classic,
    /// containerd's store (`driver-type = io.containerd.snapshotter.v1`): the image's target
    /// descriptor is kept.
    Containerd,
}

impl ImageStore {
    /// Reads the store from `docker info`'s driver status.
    pub fn from_driver_status(status: Option<&[Vec<String>]>) -> ImageStore {
        let containerd = status.unwrap_or_default().iter().any(|pair| {
            pair.iter()
                .any(|v| v.contains("io.containerd.snapshotter.v1"))
        });
        if containerd {
            ImageStore::Containerd
        } else {
            ImageStore::Classic
        }
    }
}

/// Why an image states no software identity (for the log; the caller's refusal says only that
/// the image has none).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unstated {
    /// Neither a repo digest nor a manifest descriptor: built or imported here, never pulled.
    #[error(
        "docker holds no manifest digest for it (an image built or imported here and never pushed to and pulled from a registry; images/build does both)"
    )]
    NoManifest,
    /// Several repo digests, none preferred by the reference.
    #[error("its repo digests name {0} different manifests")]
    Ambiguous(usize),
    /// A pinned reference whose digest docker did not record (never expected).
    #[error("its reference is pinned to {0}, which is not among its repo digests")]
    PinNotRecorded(String),
    /// The containerd store's descriptor is not one image manifest.
    #[error(
        "its descriptor is a {0}, not one image manifest (a multi-platform index is not selected)"
    )]
    NotAManifest(String),
    /// The image states no operating system or architecture.
    #[error("docker states no platform for it")]
    NoPlatform,
    /// The result would not be a valid identity (characters or length of wire.md §6.3).
    #[error("{0:?} is not a valid software identity")]
    Invalid(String),
}

/// The software identity of `image`, inspected through `reference`, on `store`.
pub fn manifest_identity(
    reference: &str,
    image: &ImageInspect,
    store: ImageStore,
) -> Result<String, Unstated> {
    let (digest, platform) = match store {
        ImageStore::Classic => (repo_digest(reference, image)?, None),
        ImageStore::Containerd => {
            let descriptor = image.descriptor.as_ref().ok_or(Unstated::NoManifest)?;
            let media_type = descriptor.media_type.clone().unwrap_or_default();
            if !MANIFEST_TYPES.contains(&media_type.as_str()) {
                return Err(Unstated::NotAManifest(media_type));
            }
            let digest = descriptor.digest.clone().unwrap_or_default();
            (digest, descriptor.platform.clone())
        }
    };
    // The descriptor's platform when it states one, else the image config's.
    let platform = match platform.filter(|p| p.os.is_some() && p.architecture.is_some()) {
        Some(OciPlatform {
            os,
            architecture,
            variant,
            ..
        }) => normalised_platform(
            os.as_deref().unwrap_or_default(),
            architecture.as_deref().unwrap_or_default(),
            variant.as_deref().unwrap_or_default(),
        ),
        None => normalised_platform(
            image.os.as_deref().unwrap_or_default(),
            image.architecture.as_deref().unwrap_or_default(),
            image.variant.as_deref().unwrap_or_default(),
        ),
    }
    .ok_or(Unstated::NoPlatform)?;
    let identity = format!("{PREFIX}{platform}@{digest}");
    if is_sha256_digest(&digest) && identity.len() <= MAX_IDENTITY && valid_identity(&identity) {
        Ok(identity)
    } else {
        Err(Unstated::Invalid(identity))
    }
}

/// The manifest digest among the image's repo digests (classic store).
fn repo_digest(reference: &str, image: &ImageInspect) -> Result<String, Unstated> {
    // (repository, digest) for every well-formed entry.
    let recorded: Vec<(&str, &str)> = image
        .repo_digests
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|entry| entry.rsplit_once('@'))
        .filter(|(_, digest)| is_sha256_digest(digest))
        .collect();
    if let Some((_, pinned)) = reference.rsplit_once('@') {
        return recorded
            .iter()
            .find(|(_, digest)| *digest == pinned)
            .map(|(_, digest)| (*digest).to_owned())
            .ok_or_else(|| Unstated::PinNotRecorded(pinned.to_owned()));
    }
    let mut digests: Vec<&str> = recorded.iter().map(|(_, d)| *d).collect();
    digests.sort_unstable();
    digests.dedup();
    match digests.as_slice() {
        [] => Err(Unstated::NoManifest),
        [one] => Ok((*one).to_owned()),
        several => {
            // Several: the one recorded for the reference's own repository, if exactly one.
            let repository = repository_of(reference);
            let mut own: Vec<&str> = recorded
                .iter()
                .filter(|(repo, _)| Some(*repo) == repository)
                .map(|(_, d)| *d)
                .collect();
            own.sort_unstable();
            own.dedup();
            match own.as_slice() {
                [one] => Ok((*one).to_owned()),
                _ => Err(Unstated::Ambiguous(several.len())),
            }
        }
    }
}

/// The repository of a `name[:tag]` reference, as docker writes it in repo digests; `None` for
/// a bare content id.
fn repository_of(reference: &str) -> Option<&str> {
    if reference.starts_with("sha256:") {
        return None;
    }
    // A ':' after the last '/' starts the tag (one before it belongs to a registry's port).
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    Some(match reference[last_slash..].rfind(':') {
        Some(colon) => &reference[..last_slash + colon],
        None => reference,
    })
}

/// `os/arch[/variant]` as containerd normalises it: x86_64 is amd64, aarch64 is arm64 (whose
/// `v8` variant is dropped, as amd64's `v1` is), arm without a variant is `v7`.
fn normalised_platform(os: &str, architecture: &str, variant: &str) -> Option<String> {
    let os = os.to_ascii_lowercase();
    let (architecture, variant) = match (architecture.to_ascii_lowercase().as_str(), variant) {
        ("x86_64" | "x86-64" | "amd64", "v1") => ("amd64".to_owned(), ""),
        ("x86_64" | "x86-64" | "amd64", v) => ("amd64".to_owned(), v),
        ("aarch64" | "arm64", "v8" | "8") => ("arm64".to_owned(), ""),
        ("aarch64" | "arm64", v) => ("arm64".to_owned(), v),
        ("armhf", _) => ("arm".to_owned(), "v7"),
        ("armel", _) => ("arm".to_owned(), "v6"),
        ("arm", "") => ("arm".to_owned(), "v7"),
        ("i386" | "i486" | "i586" | "i686", v) => ("386".to_owned(), v),
        (other, v) => (other.to_owned(), v),
    };
    if os.is_empty() || architecture.is_empty() {
        return None;
    }
    Some(if variant.is_empty() {
        format!("{os}/{architecture}")
    } else {
        format!("{os}/{architecture}/{}", variant.to_ascii_lowercase())
    })
}

fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The identity alphabet of wire.md §6.3.
fn valid_identity(identity: &str) -> bool {
    identity
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._:/@+-".contains(&b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
