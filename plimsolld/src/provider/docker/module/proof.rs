//! The module image's part of the startup proof (providers.md §5.12): after the probe
//! container's checks (which every image gets), a runner plan proves the runner is not
//! inspectable and has the worker list its models, then one model runs through exactly the
//! module run path.

use std::time::Duration;

use plimsoll::wire::{ModuleRow, ProjectOutcome};

use super::catalogue::Catalogue;
use super::{WORKER, project};
use crate::provider::docker::container::Context;
use crate::provider::docker::preflight::VerifiedImage;
use crate::provider::docker::{Docker, DockerError};
use crate::provider::{Hold, ModulePlan, ProjectPlan, Provider, ProviderError};

/// The proof's budget for each of its two runs.
const PROOF_TIMEOUT: Duration = Duration::from_secs(30);

impl Docker {
    /// The module image's models, as its worker lists them, with the runner checked.
    pub(in crate::provider::docker) async fn models(
        &self,
        ctx: &Context<'_>,
        image: &VerifiedImage,
    ) -> Result<Catalogue, DockerError> {
        let plan = ProjectPlan {
            files: Vec::new(),
            steps: vec![self.inspect_step(), format!("{WORKER} --list")],
            artifacts: Vec::new(),
            timeout: PROOF_TIMEOUT,
            hold: Hold::default(),
            grant: None,
        };
        let ran = project::run(ctx, image, &plan, Hold::default()).await?;
        let result = &ran.result;
        let smoke = |detail: String| DockerError::Smoke {
            check: "module worker",
            detail: format!("the module image {}: {detail}", image.reference),
        };
        if result.outcome != ProjectOutcome::PROJECT_OUTCOME_COMPLETED
            || result.steps.len() != 2
            || result.steps.iter().any(|s| s.exit_code != 0)
        {
            return Err(smoke(format!(
                "outcome {:?} ({}), exits {:?}",
                result.outcome,
                result.outcome_detail,
                result.steps.iter().map(|s| s.exit_code).collect::<Vec<_>>()
            )));
        }
        let listing = String::from_utf8_lossy(&result.steps[1].stdout);
        Catalogue::parse(&listing).map_err(|e| smoke(format!("its model list: {e}")))
    }

    /// The first model, one row of ones, one step: through the module run path, it must
    /// complete with one row (whatever that row's status: a model may refuse ones).
    pub(in crate::provider::docker) async fn prove_module_run(&self) -> Result<(), ProviderError> {
        let Some((model, shape)) = self.inner.models().and_then(|m| {
            let id = m.ids().next()?.to_owned();
            m.get(&id).map(|shape| (id, shape))
        }) else {
            return Err(ProviderError::Infrastructure(
                "the module image lists no model".into(),
            ));
        };
        let report = self
            .run_module(ModulePlan {
                model: model.clone(),
                rows: vec![ModuleRow {
                    values: vec![1.0; shape.params as usize],
                    ..Default::default()
                }],
                end_time: 1.0,
                step: 1.0,
                timeout: PROOF_TIMEOUT,
                hold: Hold::default(),
            })
            .await?;
        let r = &report.result;
        let outputs_fit = r
            .runs
            .iter()
            .all(|run| run.outputs.len() == run.status.max(0) as usize * shape.outputs as usize);
        if r.outcome != ProjectOutcome::PROJECT_OUTCOME_COMPLETED
            || r.runs.len() != 1
            || r.width != shape.outputs as i32
            || !outputs_fit
        {
            return Err(ProviderError::infrastructure(DockerError::Smoke {
                check: "module run",
                detail: format!(
                    "model {model}: outcome {:?} ({}), {} runs of width {}",
                    r.outcome,
                    r.outcome_detail,
                    r.runs.len(),
                    r.width
                ),
            }));
        }
        Ok(())
    }
}
