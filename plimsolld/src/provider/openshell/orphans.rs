//! The orphan sweep (grants.md §8.6, §9), every minute from the daemon's background loop.
//!
//! Every sandbox labelled `plimsoll.run=1` and not already DELETING is considered. One of
//! this daemon's (its instance label) that no run tracks is deleted at any age: a crash or a
//! failed delete left it. Another daemon's is deleted only when its creation time plus its
//! `plimsoll.lifetime` plus 5 minutes has passed on the **gateway's** clock, read through the
//! skew measured at this daemon's own creates; until one is measured, none is. A missing or
//! unparseable lifetime (or zero), or a missing creation time, is never deleted.

use std::time::Duration;

use super::proto::v1::{Sandbox, SandboxPhase};
use super::sandbox::{Fleet, created_ms, phase};
use super::shape::{LABEL_INSTANCE, LABEL_LIFETIME, LABEL_RUN};

/// How long past its lifetime another daemon's sandbox is left alone.
pub const GRACE: Duration = Duration::from_secs(300);
/// The page size of the listing.
const PAGE_SIZE: i32 = 100;
/// The most pages read per sweep.
const MAX_PAGES: usize = 50;

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Deleted.
    pub deleted: usize,
    /// Deletes that failed.
    pub failed: usize,
}

/// Why a sandbox may be deleted, if it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it.
    Keep,
    /// This daemon's, untracked.
    Ours,
    /// Another daemon's, past its lifetime and the grace.
    Expired,
}

/// The rule, for one sandbox. `gateway_now_ms` is the gateway's clock, if measured.
pub fn verdict(
    sandbox: &Sandbox,
    instance: &str,
    tracked: impl Fn(&str) -> bool,
    gateway_now_ms: Option<i64>,
) -> Verdict {
    let Some(meta) = sandbox.metadata.as_ref() else {
        return Verdict::Keep;
    };
    if meta.labels.get(LABEL_RUN).map(String::as_str) != Some("1")
        || phase(sandbox) == SandboxPhase::Deleting
    {
        return Verdict::Keep;
    }
    if meta.labels.get(LABEL_INSTANCE).map(String::as_str) == Some(instance) {
        return if tracked(&meta.name) {
            Verdict::Keep
        } else {
            Verdict::Ours
        };
    }
    let lifetime = meta
        .labels
        .get(LABEL_LIFETIME)
        .and_then(|l| l.parse::<u64>().ok())
        .filter(|l| *l > 0);
    let (Some(lifetime), Some(created), Some(now)) =
        (lifetime, created_ms(sandbox), gateway_now_ms)
    else {
        return Verdict::Keep;
    };
    let Some(limit) = i64::try_from(lifetime)
        .ok()
        .and_then(|l| l.checked_add(GRACE.as_secs() as i64))
        .and_then(|s| s.checked_mul(1000))
        .and_then(|ms| created.checked_add(ms))
    else {
        return Verdict::Keep;
    };
    if now > limit {
        Verdict::Expired
    } else {
        Verdict::Keep
    }
}

/// Lists every plimsoll sandbox (at most 50 pages of 100) and deletes what the rule allows.
pub async fn sweep(fleet: &Fleet) -> Swept {
    let mut swept = Swept::default();
    let mut token = String::new();
    let selector = format!("{LABEL_RUN}=1");
    for _ in 0..MAX_PAGES {
        let page = match fleet.gateway.list(&selector, PAGE_SIZE, token).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(error = %e, "orphan sweep: listing failed");
                break;
            }
        };
        let now = fleet.skew.gateway_now_ms();
        for sandbox in &page.sandboxes {
            let v = verdict(sandbox, &fleet.instance, |n| fleet.held.contains(n), now);
            if v == Verdict::Keep {
                continue;
            }
            let name = sandbox
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            tracing::info!(sandbox = %name, verdict = ?v, "orphan sweep: deleting");
            if fleet.delete(&name).await {
                swept.deleted += 1;
            } else {
                swept.failed += 1;
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::super::proto::datamodel::v1::ObjectMeta;
    use super::super::proto::v1::SandboxStatus;
    use super::*;

    fn sandbox(instance: &str, lifetime: Option<&str>, created_s: Option<i64>) -> Sandbox {
        let mut labels = vec![
            (LABEL_RUN.to_owned(), "1".to_owned()),
            (LABEL_INSTANCE.to_owned(), instance.to_owned()),
        ];
        if let Some(l) = lifetime {
            labels.push((LABEL_LIFETIME.to_owned(), l.to_owned()));
        }
        Sandbox {
            metadata: Some(ObjectMeta {
                name: "plp-00000000000000".into(),
                labels: labels.into_iter().collect(),
                created_time: created_s.map(|seconds| prost_types::Timestamp { seconds, nanos: 0 }),
                ..ObjectMeta::default()
            }),
            status: Some(SandboxStatus {
                phase: SandboxPhase::Ready.into(),
                ..SandboxStatus::default()
            }),
            ..Sandbox::default()
        }
    }

    #[test]
    fn ours_untracked_go_at_any_age_and_tracked_stay() {
        let s = sandbox("me", Some("30"), None);
        assert_eq!(verdict(&s, "me", |_| false, None), Verdict::Ours);
        assert_eq!(verdict(&s, "me", |_| true, None), Verdict::Keep);
    }

    #[test]
    fn anothers_go_only_past_lifetime_and_grace_on_the_gateway_clock() {
        let s = sandbox("other", Some("30"), Some(1_000));
        let limit_ms = (1_000 + 30 + 300) * 1000;
        assert_eq!(verdict(&s, "me", |_| false, Some(limit_ms)), Verdict::Keep);
        assert_eq!(
            verdict(&s, "me", |_| false, Some(limit_ms + 1)),
            Verdict::Expired
        );
        // No skew measured yet: never.
        assert_eq!(verdict(&s, "me", |_| false, None), Verdict::Keep);
        for lifetime in [None, Some("0"), Some("x"), Some("-5")] {
            let s = sandbox("other", lifetime, Some(1_000));
            assert_eq!(
                verdict(&s, "me", |_| false, Some(i64::MAX)),
                Verdict::Keep,
                "{lifetime:?}"
            );
        }
        let no_time = sandbox("other", Some("30"), None);
        assert_eq!(
            verdict(&no_time, "me", |_| false, Some(i64::MAX)),
            Verdict::Keep
        );
    }

    #[test]
    fn deleting_and_unlabelled_sandboxes_are_left_alone() {
        let mut s = sandbox("me", Some("30"), None);
        if let Some(st) = s.status.as_mut() {
            st.phase = SandboxPhase::Deleting.into();
        }
        assert_eq!(verdict(&s, "me", |_| false, None), Verdict::Keep);
        let mut unlabelled = sandbox("me", Some("30"), None);
        if let Some(m) = unlabelled.metadata.as_mut() {
            m.labels.remove(LABEL_RUN);
        }
        assert_eq!(verdict(&unlabelled, "me", |_| false, None), Verdict::Keep);
    }
}
