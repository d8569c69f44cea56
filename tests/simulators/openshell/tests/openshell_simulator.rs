//! The simulator's behaviour that OpenShell's published client does not exercise (its
//! fidelity test, fidelity/test_client.py, covers the rest): faults, the ForwardTcp limits,
//! process-group kill on cancel, stop and start, the clock, phases. Each test starts the
//! built binary under the runtime in PLIMSOLL_TEST_DOCKER_RUNTIME (runc by default) and
//! talks to it over mutual TLS with the generated client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use openshell_simulator::launch::{LaunchOptions, Simulator};
use openshell_simulator::proto::datamodel::v1::WorkspaceSelector;
use openshell_simulator::proto::sandbox::v1::{
    FilesystemPolicy, GetSandboxConfigRequest, LandlockPolicy, PolicySource, SandboxPolicy,
};
use openshell_simulator::proto::v1::open_shell_client::OpenShellClient;
use openshell_simulator::proto::v1::*;
use openshell_simulator::{ConfigFault, Faults, GatewayInfoError, ReadbackFault};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

#[path = "openshell_simulator/forwarding.rs"]
mod forwarding;

use forwarding::{forward, ssh_token};

const IMAGE: &str = "plimsoll/sandbox-node:latest";
type Client = OpenShellClient<Channel>;

/// A simulator, its certificates' directory, and a client for it.
struct Harness {
    sim: Simulator,
    _dir: tempfile::TempDir,
    client: Client,
}

async fn harness() -> Option<Harness> {
    if !plimsoll_tests::docker::docker_ready() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let options = LaunchOptions::new(dir.path())
        .runtime(plimsoll_tests::docker::runtime())
        .arg("--log")
        .arg("warn");
    let options = LaunchOptions {
        binary: env!("CARGO_BIN_EXE_openshell-simulator").into(),
        ..options
    };
    let sim = Simulator::start(options).unwrap();
    let client = connect(&sim, true).await.unwrap();
    Some(Harness {
        sim,
        _dir: dir,
        client,
    })
}

async fn connect(sim: &Simulator, with_cert: bool) -> Result<Client, tonic::transport::Error> {
    let pki = &sim.ready.pki;
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca_file).unwrap()))
        .domain_name("localhost");
    if with_cert {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&pki.cert_file).unwrap(),
            std::fs::read(&pki.key_file).unwrap(),
        ));
    }
    let channel = Channel::from_shared(sim.ready.grpc_url.clone())
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(OpenShellClient::new(channel))
}

fn scope() -> Option<WorkspaceSelector> {
    Some(WorkspaceSelector {
        selection: Some(
            openshell_simulator::proto::datamodel::v1::workspace_selector::Selection::Workspace(
                "default".into(),
            ),
        ),
    })
}

fn policy() -> SandboxPolicy {
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: false,
            read_only: vec!["/usr".into(), "/etc".into()],
            read_write: vec!["/tmp".into(), "/dev/null".into()],
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "hard_requirement".into(),
        }),
        ..Default::default()
    }
}

fn request(name: &str) -> CreateSandboxRequest {
    let limits = prost_types::Struct {
        fields: [("memory", "256Mi"), ("cpu", "1")]
            .into_iter()
            .map(|(k, v)| {
                let v = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(v.into())),
                };
                (k.to_owned(), v)
            })
            .collect(),
    };
    let resources = prost_types::Struct {
        fields: [(
            "limits".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(limits)),
            },
        )]
        .into_iter()
        .collect(),
    };
    CreateSandboxRequest {
        workspace_scope: scope(),
        name: name.into(),
        labels: [("plimsoll.run".to_owned(), "1".to_owned())]
            .into_iter()
            .collect(),
        spec: Some(SandboxSpec {
            template: Some(SandboxTemplate {
                image: IMAGE.into(),
                resources: Some(resources),
                ..Default::default()
            }),
            policy: Some(policy()),
            command: vec!["sleep".into(), "2147483647".into()],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn get(client: &mut Client, name: &str) -> Result<Sandbox, tonic::Status> {
    let req = GetSandboxRequest {
        workspace_scope: scope(),
        name: name.into(),
    };
    Ok(client.get_sandbox(req).await?.into_inner().sandbox.unwrap())
}

fn phase(sandbox: &Sandbox) -> SandboxPhase {
    SandboxPhase::try_from(sandbox.status.as_ref().unwrap().phase).unwrap()
}

async fn wait_phase(client: &mut Client, name: &str, want: SandboxPhase) -> Sandbox {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sandbox = get(client, name).await.unwrap();
        if phase(&sandbox) == want {
            return sandbox;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {want:?}: {sandbox:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_ready(client: &mut Client, name: &str) -> Sandbox {
    client.create_sandbox(request(name)).await.unwrap();
    wait_phase(client, name, SandboxPhase::Ready).await
}

/// Runs a command to its end: (stdout, stderr, exit code or the status that ended it).
async fn exec(
    client: &mut Client,
    name: &str,
    argv: &[&str],
) -> (String, String, Result<i32, tonic::Status>) {
    let req = ExecSandboxRequest {
        workspace_scope: scope(),
        sandbox: name.into(),
        command: argv.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    };
    let mut stream = client.exec_sandbox(req).await.unwrap().into_inner();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut exit = None;
    loop {
        match stream.message().await {
            Ok(Some(event)) => match event.payload.unwrap() {
                exec_sandbox_event::Payload::Stdout(d) => out.extend(d.data),
                exec_sandbox_event::Payload::Stderr(d) => err.extend(d.data),
                exec_sandbox_event::Payload::Exit(e) => exit = Some(Ok(e.exit_code)),
            },
            Ok(None) => break,
            Err(status) => {
                exit = Some(Err(status));
                break;
            }
        }
    }
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (
        text(out),
        text(err),
        exit.expect("the stream ended without an exit event or status"),
    )
}

#[tokio::test]
async fn gateway_info_reports_one_docker_driver_and_its_faults() {
    let Some(mut h) = harness().await else { return };
    let info = h
        .client
        .get_gateway_info(GetGatewayInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.compute_drivers.len(), 1);
    let caps = info.compute_drivers[0].capabilities.clone().unwrap();
    assert_eq!(
        (
            info.compute_drivers[0].name.as_str(),
            caps.driver_name.as_str()
        ),
        ("docker", "docker")
    );
    let res = caps.resource_capabilities.unwrap();
    assert!(res.cpu.unwrap().limit_supported && res.memory.unwrap().limit_supported);

    h.sim
        .set_faults(&Faults {
            second_compute_driver: true,
            ..Faults::default()
        })
        .await
        .unwrap();
    let info = h
        .client
        .get_gateway_info(GetGatewayInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.compute_drivers.len(), 2);
    for (error, code) in [
        (GatewayInfoError::PermissionDenied, Code::PermissionDenied),
        (GatewayInfoError::Unauthenticated, Code::Unauthenticated),
    ] {
        h.sim
            .set_faults(&Faults {
                gateway_info_error: Some(error),
                ..Faults::default()
            })
            .await
            .unwrap();
        let refused = h
            .client
            .get_gateway_info(GetGatewayInfoRequest {})
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code);
    }
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let Some(h) = harness().await else { return };
    let refused = match connect(&h.sim, false).await {
        Err(_) => true,
        Ok(mut client) => client.health(HealthRequest {}).await.is_err(),
    };
    assert!(refused, "the gateway served a client without a certificate");
}

/// Each read-back fault changes its one field, and only while it is on.
#[tokio::test]
async fn every_readback_fault_changes_its_field() {
    let Some(mut h) = harness().await else { return };
    let truth = create_ready(&mut h.client, "rb").await;
    let spec = |s: &Sandbox| s.spec.clone().unwrap();
    let template = |s: &Sandbox| spec(s).template.unwrap();
    type Probe = fn(&Sandbox) -> String;
    let probes: [(ReadbackFault, Probe); 14] = [
        (ReadbackFault::Labels, |s| {
            format!("{:?}", s.metadata.as_ref().unwrap().labels)
        }),
        (ReadbackFault::Image, |s| {
            s.spec.clone().unwrap().template.unwrap().image
        }),
        (ReadbackFault::Resources, |s| {
            format!("{:?}", s.spec.clone().unwrap().template.unwrap().resources)
        }),
        (ReadbackFault::Policy, |s| {
            format!("{:?}", s.spec.clone().unwrap().policy)
        }),
        (ReadbackFault::Providers, |s| {
            format!("{:?}", s.spec.clone().unwrap().providers)
        }),
        (ReadbackFault::DriverConfig, |s| {
            format!(
                "{:?}",
                s.spec.clone().unwrap().template.unwrap().driver_config
            )
        }),
        (ReadbackFault::Command, |s| {
            format!("{:?}", s.spec.clone().unwrap().command)
        }),
        (ReadbackFault::AgentSocket, |s| {
            s.spec.clone().unwrap().template.unwrap().agent_socket
        }),
        (ReadbackFault::SpecEnvironment, |s| {
            format!("{:?}", s.spec.clone().unwrap().environment)
        }),
        (ReadbackFault::TemplateEnvironment, |s| {
            format!(
                "{:?}",
                s.spec.clone().unwrap().template.unwrap().environment
            )
        }),
        (ReadbackFault::RuntimeClassName, |s| {
            s.spec.clone().unwrap().template.unwrap().runtime_class_name
        }),
        (ReadbackFault::UserNamespaces, |s| {
            format!(
                "{:?}",
                s.spec.clone().unwrap().template.unwrap().user_namespaces
            )
        }),
        (ReadbackFault::TemplateLabels, |s| {
            format!("{:?}", s.spec.clone().unwrap().template.unwrap().labels)
        }),
        (ReadbackFault::TemplateAnnotations, |s| {
            format!(
                "{:?}",
                s.spec.clone().unwrap().template.unwrap().annotations
            )
        }),
    ];
    // Never-set fields are empty in the truth.
    assert!(template(&truth).agent_socket.is_empty() && template(&truth).user_namespaces.is_none());
    assert!(spec(&truth).providers.is_empty() && template(&truth).labels.is_empty());
    for (fault, probe) in &probes {
        h.sim
            .set_faults(&Faults {
                readback: vec![*fault],
                ..Faults::default()
            })
            .await
            .unwrap();
        let read = get(&mut h.client, "rb").await.unwrap();
        assert_ne!(
            probe(&read),
            probe(&truth),
            "{fault:?} left its field alone"
        );
        for (other, other_probe) in probes.iter().filter(|(f, _)| f != fault) {
            assert_eq!(
                other_probe(&read),
                other_probe(&truth),
                "{fault:?} also changed {other:?}"
            );
        }
    }
    h.sim.set_faults(&Faults::default()).await.unwrap();
    let read = get(&mut h.client, "rb").await.unwrap();
    for (fault, probe) in &probes {
        assert_eq!(probe(&read), probe(&truth), "{fault:?} outlived its fault");
    }
}

#[tokio::test]
async fn sandbox_config_hashes_the_policy_as_the_gateway_does_and_its_faults_break_it() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "cfg").await;
    let ask = || GetSandboxConfigRequest {
        workspace_scope: scope(),
        name: "cfg".into(),
    };
    let config = h
        .client
        .get_sandbox_config(ask())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(config.policy, Some(policy()));
    assert_eq!(
        config.policy_hash,
        openshell_simulator::policy_hash::policy_hash(&policy())
    );
    assert_eq!(config.policy_source, PolicySource::Sandbox as i32);
    assert!(config.configuration_admitted);
    let proposals = config
        .settings
        .get("agent_policy_proposals_enabled")
        .expect("the key is always present");
    assert!(
        proposals.value.is_none(),
        "off is a present key with no value"
    );

    for fault in [
        ConfigFault::PolicyHash,
        ConfigFault::Policy,
        ConfigFault::PolicySource,
        ConfigFault::NotAdmitted,
        ConfigFault::ProposalsEnabled,
        ConfigFault::ProposalsMissing,
        ConfigFault::ProposalsWrongType,
    ] {
        h.sim
            .set_faults(&Faults {
                config: vec![fault],
                ..Faults::default()
            })
            .await
            .unwrap();
        let bad = h
            .client
            .get_sandbox_config(ask())
            .await
            .unwrap()
            .into_inner();
        assert_ne!(bad, config, "{fault:?} changed nothing");
        let hash_matches = bad
            .policy
            .as_ref()
            .map(openshell_simulator::policy_hash::policy_hash)
            == Some(bad.policy_hash.clone());
        assert_eq!(hash_matches, fault != ConfigFault::PolicyHash, "{fault:?}");
    }
}

#[tokio::test]
async fn a_delete_held_at_accepted_finishes_when_the_fault_is_cleared() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "held").await;
    h.sim
        .set_faults(&Faults {
            delete_stays_accepted: true,
            ..Faults::default()
        })
        .await
        .unwrap();
    let del = || DeleteSandboxRequest {
        workspace_scope: scope(),
        name: "held".into(),
        ..Default::default()
    };
    let answer = h.client.delete_sandbox(del()).await.unwrap().into_inner();
    assert_eq!(answer.outcome, DeletionOutcome::Accepted as i32);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = get(&mut h.client, "held").await.unwrap();
    assert_eq!(phase(&still), SandboxPhase::Deleting);
    assert!(still.metadata.unwrap().deletion_time.is_some());
    h.sim.set_faults(&Faults::default()).await.unwrap();
    assert_eq!(
        get(&mut h.client, "held").await.unwrap_err().code(),
        Code::NotFound
    );
    let again = h.client.delete_sandbox(del()).await.unwrap_err();
    assert_eq!(again.code(), Code::NotFound);
}

#[tokio::test]
async fn a_sandbox_that_dies_mid_run_ends_the_exec_without_an_exit_and_reads_back_error() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "dies").await;
    h.sim
        .set_faults(&Faults {
            die_after_exec_start_ms: Some(300),
            ..Faults::default()
        })
        .await
        .unwrap();
    let (_, _, end) = exec(&mut h.client, "dies", &["sleep", "30"]).await;
    assert_eq!(end.unwrap_err().code(), Code::Unavailable);
    wait_phase(&mut h.client, "dies", SandboxPhase::Error).await;
    h.sim.set_faults(&Faults::default()).await.unwrap();
    let refused = h
        .client
        .exec_sandbox(ExecSandboxRequest {
            workspace_scope: scope(),
            sandbox: "dies".into(),
            command: vec!["true".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
}

async fn count_sleepers(client: &mut Client, name: &str, marker: &str) -> usize {
    let (out, _, _) = exec(client, name, &["ps", "-o", "args"]).await;
    out.lines().filter(|l| l.trim() == marker).count()
}

#[tokio::test]
async fn cancelling_an_exec_stream_kills_its_whole_process_group() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "cancel").await;
    let (tx, rx) = mpsc::channel(4);
    let start = ExecSandboxRequest {
        workspace_scope: scope(),
        sandbox: "cancel".into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "sleep 301 & sleep 301 & echo started; cat; wait".into(),
        ],
        ..Default::default()
    };
    tx.send(ExecSandboxInput {
        payload: Some(exec_sandbox_input::Payload::Start(start)),
    })
    .await
    .unwrap();
    let mut events = h
        .client
        .exec_sandbox_interactive(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = events.message().await.unwrap().unwrap();
    assert!(
        matches!(first.payload, Some(exec_sandbox_event::Payload::Stdout(ref d)) if d.data == b"started\n")
    );
    assert_eq!(
        count_sleepers(&mut h.client, "cancel", "sleep 301").await,
        2
    );
    drop(events);
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_sleepers(&mut h.client, "cancel", "sleep 301").await > 0 {
        assert!(
            Instant::now() < deadline,
            "the cancelled exec's processes are still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn stdin_frames_then_half_close_reach_the_command() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "stdin").await;
    let (tx, rx) = mpsc::channel(8);
    let start = ExecSandboxRequest {
        workspace_scope: scope(),
        sandbox: "stdin".into(),
        command: vec!["wc".into(), "-c".into()],
        no_login_shell: true,
        ..Default::default()
    };
    tx.send(ExecSandboxInput {
        payload: Some(exec_sandbox_input::Payload::Start(start)),
    })
    .await
    .unwrap();
    for _ in 0..4 {
        tx.send(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(vec![b'x'; 64 * 1024])),
        })
        .await
        .unwrap();
    }
    drop(tx);
    let mut events = h
        .client
        .exec_sandbox_interactive(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    let mut exit = None;
    while let Some(event) = events.message().await.unwrap() {
        match event.payload.unwrap() {
            exec_sandbox_event::Payload::Stdout(d) => out.extend(d.data),
            exec_sandbox_event::Payload::Exit(e) => exit = Some(e.exit_code),
            exec_sandbox_event::Payload::Stderr(_) => {}
        }
    }
    assert_eq!(
        (String::from_utf8(out).unwrap().trim(), exit),
        ("262144", Some(0))
    );
}

#[tokio::test]
async fn execution_timeout_answers_124_and_leaves_the_command_running() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "timeout").await;
    let req = ExecSandboxRequest {
        workspace_scope: scope(),
        sandbox: "timeout".into(),
        command: vec!["sleep".into(), "302".into()],
        execution_timeout: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..Default::default()
    };
    let mut stream = h.client.exec_sandbox(req).await.unwrap().into_inner();
    let event = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        event.payload,
        Some(exec_sandbox_event::Payload::Exit(ExecSandboxExit {
            exit_code: 124
        }))
    ));
    assert_eq!(
        count_sleepers(&mut h.client, "timeout", "sleep 302").await,
        1,
        "OpenShell leaves it running"
    );
}

#[tokio::test]
async fn stop_ends_processes_keeps_files_and_tokens_go_and_start_answers_starting() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "pause").await;
    let (_, _, code) = exec(
        &mut h.client,
        "pause",
        &[
            "sh",
            "-c",
            "echo kept > /tmp/f; sleep 303 >/dev/null 2>&1 &",
        ],
    )
    .await;
    assert_eq!(code.unwrap(), 0);
    let token = ssh_token(&mut h.client, "pause").await;
    let stop = || StopSandboxRequest {
        workspace_scope: scope(),
        name: "pause".into(),
        ..Default::default()
    };
    let start = || StartSandboxRequest {
        workspace_scope: scope(),
        name: "pause".into(),
        ..Default::default()
    };
    let stopped = h
        .client
        .stop_sandbox(stop())
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(phase(&stopped), SandboxPhase::Stopped);
    let started = h
        .client
        .start_sandbox(start())
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(phase(&started), SandboxPhase::Starting);
    let refused = h.client.stop_sandbox(stop()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::FailedPrecondition,
        "stop works only from READY"
    );
    wait_phase(&mut h.client, "pause", SandboxPhase::Ready).await;
    assert_eq!(
        exec(&mut h.client, "pause", &["cat", "/tmp/f"]).await.0,
        "kept\n"
    );
    assert_eq!(count_sleepers(&mut h.client, "pause", "sleep 303").await, 0);
    let (status, _) = forward(&mut h.client, "pause", &token, 1).await;
    assert_eq!(
        status.unwrap_err().code(),
        Code::Unauthenticated,
        "stop drops the tokens"
    );
}

#[tokio::test]
async fn the_gateway_clock_can_be_skewed_and_phases_can_be_slowed() {
    let Some(mut h) = harness().await else { return };
    let hour_ms = 3_600_000;
    h.sim
        .set_faults(&Faults {
            clock_skew_ms: hour_ms,
            provision_delay_ms: 1_500,
            ..Faults::default()
        })
        .await
        .unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let created = h
        .client
        .create_sandbox(request("skew"))
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(phase(&created), SandboxPhase::Provisioning);
    let t = created.metadata.unwrap().created_time.unwrap();
    let gap = t.seconds * 1000 + i64::from(t.nanos / 1_000_000) - before;
    assert!(
        (hour_ms - 1_000..hour_ms + 5_000).contains(&gap),
        "created_time is {gap} ms after the host's now"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        phase(&get(&mut h.client, "skew").await.unwrap()),
        SandboxPhase::Provisioning
    );
    wait_phase(&mut h.client, "skew", SandboxPhase::Ready).await;
}

#[tokio::test]
async fn list_selects_by_label_and_pages() {
    let Some(mut h) = harness().await else { return };
    for name in ["l-a", "l-b", "l-c"] {
        let mut req = request(name);
        if name == "l-c" {
            req.labels.clear();
        }
        h.client.create_sandbox(req).await.unwrap();
    }
    let list = |token: &str| ListSandboxesRequest {
        workspace_scope: scope(),
        page_size: 1,
        page_token: token.into(),
        label_selector: "plimsoll.run=1".into(),
    };
    let first = h
        .client
        .list_sandboxes(list(""))
        .await
        .unwrap()
        .into_inner();
    let second = h
        .client
        .list_sandboxes(list(&first.next_page_token))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = first
        .sandboxes
        .iter()
        .chain(&second.sandboxes)
        .map(|s| s.metadata.clone().unwrap().name)
        .collect();
    assert_eq!(names, ["l-a", "l-b"]);
    assert!(second.next_page_token.is_empty());
    let bad = ListSandboxesRequest {
        workspace_scope: scope(),
        label_selector: "no-equals".into(),
        ..Default::default()
    };
    assert_eq!(
        h.client.list_sandboxes(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let missing = ListSandboxesRequest::default();
    assert_eq!(
        h.client.list_sandboxes(missing).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}
