//! Making an answer hashable as sent (`wire.md` §6.7, `records.md` §4.3): guest text repaired
//! to valid UTF-8 and every module NaN made the one canonical quiet NaN.
//!
//! Clients recompute the result digest from what they decode, so anything a transport could
//! change (invalid UTF-8 in a string, a NaN payload lost in JSON) must be settled before the
//! daemon hashes.

use crate::wire::{RunResponse, run_response};

/// The bits of the one NaN an answer may carry: the canonical quiet NaN.
pub const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

/// Text from a guest (a step's command, an outcome detail, an artifact path) as a valid UTF-8
/// string.
///
/// Each maximal invalid subsequence becomes one U+FFFD, following the Unicode "substitution of
/// maximal subparts" practice (the behaviour of `String::from_utf8_lossy`). Valid input is
/// returned unchanged. Output bytes (`stdout`, `stderr`, artifact contents) are `bytes` on
/// the wire and must never be repaired.
pub fn repair_utf8(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `x`, with any NaN (signalling, negative, any payload) replaced by the canonical quiet NaN
/// [`CANONICAL_NAN_BITS`].
///
/// Every other value is kept bit for bit, negative zero and the infinities included.
pub fn canonical_nan(x: f64) -> f64 {
    if x.is_nan() {
        f64::from_bits(CANONICAL_NAN_BITS)
    } else {
        x
    }
}

/// Rewrites every NaN in a module result's outputs to the canonical quiet NaN, in place, so
/// the response can be hashed and sent.
///
/// Only module outputs are touched: no other result carries doubles. Strings need no repair
/// here because a Rust `String` is valid UTF-8 already; repair guest text with
/// [`repair_utf8`] when it is first turned into a string.
pub fn canonicalize_response(resp: &mut RunResponse) {
    if let Some(run_response::Result::Module(module)) = &mut resp.result {
        for run in &mut module.runs {
            for output in &mut run.outputs {
                *output = canonical_nan(*output);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ModuleResult, ModuleRowResult};

    #[test]
    fn valid_utf8_is_unchanged() {
        assert_eq!(repair_utf8("héllo ✓".as_bytes()), "héllo ✓");
        assert_eq!(repair_utf8(b""), "");
    }

    #[test]
    fn each_invalid_sequence_becomes_one_replacement_character() {
        assert_eq!(repair_utf8(b"a\xffb"), "a\u{fffd}b");
        // Two stray bytes are two invalid sequences.
        assert_eq!(repair_utf8(b"a\xff\xfeb"), "a\u{fffd}\u{fffd}b");
        // A truncated three-byte sequence is one maximal subpart, so one U+FFFD.
        assert_eq!(repair_utf8(b"a\xe2\x82b"), "a\u{fffd}b");
        // A truncated sequence at the very end.
        assert_eq!(repair_utf8(b"ok\xf0\x9f"), "ok\u{fffd}");
        // An encoded surrogate is invalid UTF-8.
        assert_eq!(repair_utf8(b"\xed\xa0\x80"), "\u{fffd}\u{fffd}\u{fffd}");
    }

    #[test]
    fn every_nan_becomes_the_canonical_quiet_nan() {
        let nans = [
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001), // signalling
            f64::from_bits(0xfff8_0000_0000_0000),
            f64::from_bits(0x7fff_ffff_ffff_ffff),
        ];
        for nan in nans {
            assert_eq!(
                canonical_nan(nan).to_bits(),
                CANONICAL_NAN_BITS,
                "{:x}",
                nan.to_bits()
            );
        }
    }

    #[test]
    fn negative_zero_and_other_values_keep_their_bits() {
        for x in [
            -0.0,
            0.0,
            1.5,
            -3.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(canonical_nan(x).to_bits(), x.to_bits());
        }
        assert!(canonical_nan(-0.0).is_sign_negative());
    }

    #[test]
    fn canonicalize_response_rewrites_every_module_output() {
        let mut resp = RunResponse {
            result: Some(
                ModuleResult {
                    runs: vec![
                        ModuleRowResult {
                            outputs: vec![-f64::NAN, -0.0],
                            ..Default::default()
                        },
                        ModuleRowResult {
                            outputs: vec![2.0, f64::from_bits(0x7ff0_0000_0000_0002)],
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        canonicalize_response(&mut resp);
        let Some(run_response::Result::Module(module)) = &resp.result else {
            panic!("the result is no longer a module");
        };
        let bits: Vec<Vec<u64>> = module
            .runs
            .iter()
            .map(|r| r.outputs.iter().map(|x| x.to_bits()).collect())
            .collect();
        assert_eq!(
            bits,
            vec![
                vec![CANONICAL_NAN_BITS, (-0.0f64).to_bits()],
                vec![2.0f64.to_bits(), CANONICAL_NAN_BITS],
            ]
        );
    }
}
