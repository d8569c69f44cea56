//! The `disabled` provider: the default. It runs nothing, ever.
//!
//! Its tier is `none`, every payload is refused with `ErrDisabled`
//! (`failed_precondition`, reason `unsupported`), and it never falls back to
//! running code another way.

use std::sync::Arc;

use async_trait::async_trait;
use plimsoll::payload::PayloadKind;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;

use super::config::{ProviderSettings, SharedSettings};
use super::{Description, Provider, ProviderError, SnippetOutcome, SnippetRun, TierEvidence};
use crate::config::{Config, Reader};

/// The provider id `Describe` and records name.
pub const ID: &str = "disabled";

const REFUSAL: &str = "no sandbox provider is configured (SANDBOX_PROVIDER is unset or disabled); \
                       this daemon runs nothing";

/// The disabled provider's settings: it has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DisabledConfig;

impl ProviderSettings for DisabledConfig {
    fn read(_r: &mut Reader<'_>, _shared: &SharedSettings) -> DisabledConfig {
        DisabledConfig
    }

    fn runs_code(&self) -> bool {
        false
    }

    fn highest_tier(&self) -> IsolationTier {
        IsolationTier::None
    }

    // Nothing runs, so every limit holds.
    fn enforces_pids(&self) -> bool {
        true
    }

    fn enforces_disk(&self) -> bool {
        true
    }

    fn build(&self, _config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(Disabled::new()))
    }
}

/// The provider that refuses everything.
#[derive(Debug, Default)]
pub struct Disabled;

impl Disabled {
    /// The disabled provider.
    pub fn new() -> Disabled {
        Disabled
    }
}

#[async_trait]
impl Provider for Disabled {
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        Ok(evidence())
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        // Nothing runs, so there is nothing to prove beyond refusing.
        Ok(evidence())
    }

    async fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    fn current_tier(&self) -> IsolationTier {
        IsolationTier::None
    }

    fn describe(&self) -> Description {
        Description {
            sandbox: ID,
            ..Description::default()
        }
    }

    fn unsupported(&self, _kind: PayloadKind) -> Refusal {
        refusal()
    }

    async fn run_snippet(&self, _run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        Err(Refusal::Disabled(REFUSAL.to_owned()).into())
    }
}

fn evidence() -> TierEvidence {
    TierEvidence {
        tier: IsolationTier::None,
        detail: "the disabled provider runs nothing".to_owned(),
    }
}

/// The refusal every payload gets from the disabled provider.
pub fn refusal() -> Refusal {
    Refusal::Disabled(REFUSAL.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_snippet_is_refused_as_disabled() {
        let p = Disabled::new();
        let err = p
            .run_snippet(SnippetRun {
                code: "console.log(1)".into(),
                timeout: Duration::from_secs(1),
                hold: crate::provider::Hold::default(),
                grant: None,
            })
            .await
            .expect_err("disabled runs nothing");
        match err {
            ProviderError::Refused(r) => {
                let (code, reason) = r.code_and_reason();
                assert_eq!(code, connectrpc::ErrorCode::FailedPrecondition);
                assert_eq!(reason, plimsoll::refusal::Reason::Unsupported);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn tier_is_none_and_proof_says_so() {
        let p = Disabled::new();
        assert_eq!(p.current_tier(), IsolationTier::None);
        assert_eq!(p.prove().await.expect("proof").tier, IsolationTier::None);
        assert_eq!(p.describe().sandbox, "disabled");
    }
}
