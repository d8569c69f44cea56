use bollard::models::{ImageInspect, OciDescriptor, OciPlatform};

use super::*;

const A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn classic(repo_digests: &[&str], os: &str, arch: &str, variant: &str) -> ImageInspect {
    ImageInspect {
        id: Some(A.to_owned()),
        repo_digests: Some(repo_digests.iter().map(|s| (*s).to_owned()).collect()),
        os: Some(os.to_owned()),
        architecture: Some(arch.to_owned()),
        variant: (!variant.is_empty()).then(|| variant.to_owned()),
        ..Default::default()
    }
}

fn on_classic(reference: &str, image: &ImageInspect) -> Result<String, Unstated> {
    manifest_identity(reference, image, ImageStore::Classic)
}

#[test]
fn one_repo_digest_is_the_identity_whatever_the_tag_is_called() {
    let image = classic(
        &[&format!("127.0.0.1:5055/plimsoll/sandbox@{A}")],
        "linux",
        "amd64",
        "",
    );
    for reference in [
        "plimsoll/sandbox:latest",
        "127.0.0.1:5055/plimsoll/sandbox:latest",
        A,
    ] {
        assert_eq!(
            on_classic(reference, &image).unwrap(),
            format!("oci-manifest:linux/amd64@{A}"),
            "{reference}"
        );
    }
}

#[test]
fn an_image_never_pulled_states_none() {
    assert_eq!(
        on_classic(
            "plimsoll/sandbox:latest",
            &classic(&[], "linux", "amd64", "")
        ),
        Err(Unstated::NoManifest)
    );
    let mut bare = classic(&[], "linux", "amd64", "");
    bare.repo_digests = None;
    assert_eq!(on_classic("x:1", &bare), Err(Unstated::NoManifest));
}

#[test]
fn a_pinned_reference_states_its_own_digest_and_only_a_recorded_one() {
    let image = classic(
        &[&format!("r/x@{A}"), &format!("s/y@{B}")],
        "linux",
        "amd64",
        "",
    );
    assert_eq!(
        on_classic(&format!("s/y@{B}"), &image).unwrap(),
        format!("oci-manifest:linux/amd64@{B}")
    );
    let other = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    assert_eq!(
        on_classic(&format!("r/x@{other}"), &image),
        Err(Unstated::PinNotRecorded(other.to_owned()))
    );
}

#[test]
fn several_digests_need_one_in_the_references_repository() {
    let image = classic(
        &[
            &format!("127.0.0.1:5055/team/app@{A}"),
            &format!("registry.example/app@{B}"),
        ],
        "linux",
        "amd64",
        "",
    );
    assert_eq!(
        on_classic("127.0.0.1:5055/team/app:v2", &image).unwrap(),
        format!("oci-manifest:linux/amd64@{A}")
    );
    assert_eq!(
        on_classic("registry.example/app", &image).unwrap(),
        format!("oci-manifest:linux/amd64@{B}")
    );
    assert_eq!(
        on_classic("team/app:latest", &image),
        Err(Unstated::Ambiguous(2))
    );
    assert_eq!(on_classic(A, &image), Err(Unstated::Ambiguous(2)));
}

#[test]
fn the_same_digest_under_two_repositories_is_one_manifest() {
    let image = classic(
        &[&format!("a/x@{A}"), &format!("b/x@{A}")],
        "linux",
        "amd64",
        "",
    );
    assert!(on_classic("c/x:1", &image).unwrap().ends_with(A));
}

#[test]
fn malformed_repo_digests_are_ignored() {
    let image = classic(
        &[
            "a/x@sha256:short",
            "a/x",
            &format!("a/x@{}", A.to_uppercase()),
        ],
        "linux",
        "amd64",
        "",
    );
    assert_eq!(on_classic("a/x:1", &image), Err(Unstated::NoManifest));
}

#[test]
fn platforms_are_normalised_as_containerd_does() {
    for ((os, arch, variant), want) in [
        (("linux", "amd64", ""), "linux/amd64"),
        (("linux", "x86_64", ""), "linux/amd64"),
        (("linux", "amd64", "v1"), "linux/amd64"),
        (("linux", "amd64", "v3"), "linux/amd64/v3"),
        (("linux", "aarch64", ""), "linux/arm64"),
        (("linux", "arm64", "v8"), "linux/arm64"),
        (("linux", "arm", ""), "linux/arm/v7"),
        (("linux", "arm", "v6"), "linux/arm/v6"),
        (("Linux", "i686", ""), "linux/386"),
    ] {
        let image = classic(&[&format!("a/x@{A}")], os, arch, variant);
        assert_eq!(
            on_classic("a/x:1", &image).unwrap(),
            format!("oci-manifest:{want}@{A}"),
            "{os} {arch} {variant}"
        );
    }
    assert_eq!(
        on_classic("a/x:1", &classic(&[&format!("a/x@{A}")], "", "amd64", "")),
        Err(Unstated::NoPlatform)
    );
}

#[test]
fn an_identity_outside_the_rule_alphabet_is_not_stated() {
    let image = classic(&[&format!("a/x@{A}")], "linux", "amd 64", "");
    assert!(matches!(
        on_classic("a/x:1", &image),
        Err(Unstated::Invalid(_))
    ));
}

fn containerd(media_type: &str, platform: Option<(&str, &str)>) -> ImageInspect {
    ImageInspect {
        id: Some(A.to_owned()),
        descriptor: Some(OciDescriptor {
            media_type: Some(media_type.to_owned()),
            digest: Some(A.to_owned()),
            platform: platform.map(|(os, arch)| OciPlatform {
                os: Some(os.to_owned()),
                architecture: Some(arch.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        // A repo digest is not used on this store: it may name an index.
        repo_digests: Some(vec![format!("a/x@{B}")]),
        os: Some("linux".to_owned()),
        architecture: Some("amd64".to_owned()),
        ..Default::default()
    }
}

#[test]
fn the_containerd_store_states_the_descriptor_of_one_manifest() {
    for media_type in MANIFEST_TYPES {
        let got = manifest_identity(
            "a/x:1",
            &containerd(media_type, None),
            ImageStore::Containerd,
        );
        assert_eq!(got.unwrap(), format!("oci-manifest:linux/amd64@{A}"));
    }
    let arm = containerd(MANIFEST_TYPES[0], Some(("linux", "arm64")));
    assert_eq!(
        manifest_identity("a/x:1", &arm, ImageStore::Containerd).unwrap(),
        format!("oci-manifest:linux/arm64@{A}")
    );
}

#[test]
fn the_containerd_store_never_states_an_index() {
    let index = containerd("application/vnd.oci.image.index.v1+json", None);
    assert!(matches!(
        manifest_identity("a/x:1", &index, ImageStore::Containerd),
        Err(Unstated::NotAManifest(_))
    ));
    let mut none = index;
    none.descriptor = None;
    assert_eq!(
        manifest_identity("a/x:1", &none, ImageStore::Containerd),
        Err(Unstated::NoManifest)
    );
}

#[test]
fn the_store_is_read_from_the_driver_status() {
    let containerd = vec![vec![
        "driver-type".to_owned(),
        "io.containerd.snapshotter.v1".to_owned(),
    ]];
    assert_eq!(
        ImageStore::from_driver_status(Some(&containerd)),
        ImageStore::Containerd
    );
    let overlay = vec![vec!["Backing Filesystem".to_owned(), "extfs".to_owned()]];
    assert_eq!(
        ImageStore::from_driver_status(Some(&overlay)),
        ImageStore::Classic
    );
    assert_eq!(ImageStore::from_driver_status(None), ImageStore::Classic);
}

#[test]
fn repositories_are_read_past_a_registry_port() {
    assert_eq!(
        repository_of("127.0.0.1:5055/p/x:latest"),
        Some("127.0.0.1:5055/p/x")
    );
    assert_eq!(
        repository_of("127.0.0.1:5055/p/x"),
        Some("127.0.0.1:5055/p/x")
    );
    assert_eq!(repository_of("x"), Some("x"));
    assert_eq!(repository_of(A), None);
}
