//! The hostile guest: what a snippet must not be able to do, under either runtime. Each test
//! asserts a typed result (never an infrastructure error) and the attack's failure.

use super::*;

/// The error code of each attempt, or "ok" when it worked.
const TRY: &str = "const fs = require('fs'); const cp = require('child_process');
const attempt = (f) => { try { const r = f(); return r === undefined ? 'ok' : r; } catch (e) { return e.code || String(e.message || e); } };";

#[test]
fn writes_to_the_root_usr_and_etc_fail() {
    require_docker!();
    let d = shared();
    let r = report(
        &d,
        &format!("{TRY} const out = {{}};
for (const p of ['/x', '/usr/x', '/usr/bin/x', '/etc/x', '/bin/x', '/var/x']) out[p] = attempt(() => fs.writeFileSync(p, 'x'));
out['/etc/passwd'] = attempt(() => fs.appendFileSync('/etc/passwd', 'x'));
out['/usr/bin/node'] = attempt(() => fs.appendFileSync('/usr/bin/node', 'x'));
out['/etc/hosts'] = attempt(() => fs.appendFileSync('/etc/hosts', 'x'));
console.log(JSON.stringify(out));"),
        10_000,
    );
    for (path, outcome) in r.as_object().unwrap() {
        assert!(
            ["EROFS", "EACCES", "EPERM", "ENOENT"].contains(&outcome.as_str().unwrap_or("ok")),
            "writing {path} must fail: {r}"
        );
    }
}

#[test]
fn a_binary_copied_to_a_writable_mount_cannot_execute() {
    require_docker!();
    let d = shared();
    let r = report(
        &d,
        &format!("{TRY} const out = {{}};
for (const dir of ['/tmp', '/dev/shm']) {{
  const copy = dir + '/bb';
  out[dir + ' copy'] = attempt(() => {{ fs.copyFileSync('/bin/busybox', copy); fs.chmodSync(copy, 0o755); }});
  out[dir + ' exec'] = attempt(() => {{ cp.execFileSync(copy, ['true']); }});
  out[dir + ' via sh'] = attempt(() => {{ cp.execFileSync('/bin/sh', ['-c', copy + ' true'], {{stdio: 'pipe'}}); }});
}}
out['/work'] = attempt(() => fs.writeFileSync('/work/x', 'x'));
console.log(JSON.stringify(out));"),
        15_000,
    );
    for dir in ["/tmp", "/dev/shm"] {
        assert_eq!(r[format!("{dir} copy")], "ok", "the copy itself works: {r}");
        assert_eq!(r[format!("{dir} exec")], "EACCES", "noexec: {r}");
        assert_ne!(
            r[format!("{dir} via sh")],
            "ok",
            "noexec through the shell: {r}"
        );
    }
    // Snippets have no /work at all (projects get a noexec one, checked by the startup proof).
    assert_ne!(r["/work"], "ok", "{r}");
}

/// This machine's own non-loopback IPv4 addresses (the docker bridge's among them): targets
/// on this machine that the guest must not reach.
fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip (iproute2) lists this machine's addresses");
    let addrs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|cidr| cidr.split('/').next().map(str::to_owned))
        .collect();
    assert!(!addrs.is_empty(), "no global IPv4 address on this machine");
    addrs
}

#[test]
fn the_guest_has_no_network_not_even_to_this_machine() {
    require_docker!();
    let d = shared();
    // Listeners on this machine that must see nothing.
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tcp_port, udp_port) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let mut targets = host_addresses();
    targets.push("127.0.0.1".to_owned());
    let code = format!(
        "const net = require('net'); const dns = require('dns');
const targets = {targets}; const out = {{}}; let pending = targets.length + 1;
const done = () => {{ if (--pending === 0) console.log(JSON.stringify(out)); }};
for (const host of targets) {{ const s = net.connect({{host, port: {tcp_port}}}); s.on('connect', () => {{ out[host] = 'connected'; s.destroy(); done(); }}); s.on('error', e => {{ out[host] = e.code; done(); }}); }}
const r = new dns.Resolver({{timeout: 1000, tries: 1}}); r.setServers([targets[0] + ':{udp_port}']);
r.resolve4('plimsoll.test', (e, a) => {{ out.dns = e ? e.code : 'answered ' + a; done(); }});
out.interfaces = Object.keys(require('os').networkInterfaces());",
        targets = serde_json::to_string(&targets).unwrap()
    );
    let r = report(&d, &code, 15_000);
    for host in &targets {
        assert!(
            r[host].is_string() && r[host] != "connected",
            "TCP to {host}: {r}"
        );
    }
    assert!(
        !r["dns"]
            .as_str()
            .unwrap_or("answered")
            .starts_with("answered"),
        "{r}"
    );
    assert_eq!(r["interfaces"], json!(["lo"]), "{r}");
    assert!(
        tcp.accept().is_err(),
        "a TCP connection reached this machine"
    );
    let mut buf = [0u8; 512];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a DNS query reached this machine"
    );
}

#[test]
fn a_fork_bomb_is_held_by_the_process_limit() {
    require_docker!();
    let d = shared();
    let code = format!(
        "{TRY} let ok = 0; const errors = {{}};
for (let i = 0; i < {attempts}; i++) {{
  const r = attempt(() => {{ const c = cp.spawn('/bin/sleep', ['3'], {{stdio: 'ignore'}}); c.on('error', e => {{ errors['async ' + e.code] = (errors['async ' + e.code] || 0) + 1; }}); if (!c.pid) return 'no pid'; }});
  if (r === 'ok') ok++; else errors[r] = (errors[r] || 0) + 1;
}}
setTimeout(() => console.log(JSON.stringify({{ok, errors}})), 1000);",
        attempts = PIDS * 3
    );
    let r = report(&d, &code, 30_000);
    let ok = r["ok"].as_u64().unwrap_or(u64::MAX);
    assert!(
        ok < u64::from(PIDS),
        "{ok} processes started under a limit of {PIDS}: {r}"
    );
    assert!(
        r["errors"].as_object().is_some_and(|e| !e.is_empty()),
        "{r}"
    );
    // The daemon and the next run are unharmed.
    assert_eq!(run(&d, "console.log('after')", 10_000).stdout, "after\n");
}

#[test]
fn a_memory_bomb_is_oom_killed_and_answered_as_a_result() {
    require_docker!();
    let d = shared();
    let ran = run(
        &d,
        "const a = []; for (let i = 0; i < 64; i++) a.push(Buffer.alloc(16 << 20).fill(1)); console.log('survived');",
        30_000,
    );
    assert_eq!((ran.exit_code, ran.timed_out), (137, false), "{ran:?}");
    assert_eq!(ran.stdout, "");
}

#[test]
fn writing_past_a_tmpfs_size_fails() {
    require_docker!();
    let d = shared();
    let r = report(
        &d,
        &format!("{TRY} const out = {{}}; const mib = Buffer.alloc(1 << 20, 1);
for (const dir of ['/tmp', '/dev/shm']) {{
  let written = 0;
  out[dir] = attempt(() => {{ const fd = fs.openSync(dir + '/fill', 'w'); try {{ for (let i = 0; i < 32; i++) {{ fs.writeSync(fd, mib); written++; }} }} finally {{ fs.closeSync(fd); }} }});
  out[dir + ' MiB'] = written;
  fs.rmSync(dir + '/fill', {{force: true}});
}}
console.log(JSON.stringify(out));"),
        20_000,
    );
    for dir in ["/tmp", "/dev/shm"] {
        assert_eq!(r[dir], "ENOSPC", "{r}");
        assert!(r[format!("{dir} MiB")].as_u64().unwrap() <= 16, "{r}");
    }
}

#[test]
fn host_files_and_the_docker_socket_are_out_of_reach() {
    require_docker!();
    let d = shared();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("host-secret");
    std::fs::write(&secret, "host secret").unwrap();
    let secret = secret.display().to_string();
    let code = format!(
        "{TRY} const net = require('net'); const out = {{}};
for (const p of ['{secret}', '/etc/shadow', '/root/.bashrc', '/var/run/docker.sock', '/run/docker.sock', '/proc/kcore', '/etc/docker/daemon.json', '/var/lib/docker'])
  out[p] = attempt(() => {{ fs.readFileSync(p); }});
let pending = 2;
for (const s of ['/var/run/docker.sock', '/run/docker.sock']) {{
  const c = net.connect(s); c.on('connect', () => {{ out['connect ' + s] = 'connected'; c.destroy(); if (--pending === 0) console.log(JSON.stringify(out)); }});
  c.on('error', e => {{ out['connect ' + s] = e.code; if (--pending === 0) console.log(JSON.stringify(out)); }});
}}"
    );
    let r = report(&d, &code, 15_000);
    for (what, outcome) in r.as_object().unwrap() {
        let outcome = outcome.as_str().unwrap_or("ok");
        assert!(
            outcome != "ok" && outcome != "connected",
            "{what} was reachable: {r}"
        );
    }
}

#[test]
fn setuid_escalation_is_impossible() {
    require_docker!();
    let d = shared();
    let r = report(
        &d,
        &format!("{TRY} const out = {{}};
out.setuid = attempt(() => process.setuid(0));
out.setgid = attempt(() => process.setgid(0));
out.setgroups = attempt(() => process.setgroups([0]));
const status = fs.readFileSync('/proc/self/status', 'utf8');
for (const k of ['NoNewPrivs', 'CapEff', 'CapPrm']) {{ const l = status.split('\\n').find(x => x.startsWith(k + ':')); out[k] = l ? l.split(/\\s+/)[1] : null; }}
const setuid = [];
const walk = (dir, depth) => {{ let names = []; try {{ names = fs.readdirSync(dir); }} catch (e) {{ return; }}
  for (const n of names) {{ const p = dir + '/' + n; let st; try {{ st = fs.lstatSync(p); }} catch (e) {{ continue; }}
    if (st.isDirectory() && depth < 6) walk(p, depth + 1); else if (st.isFile() && (st.mode & 0o6000)) setuid.push(p); }} }};
for (const dir of ['/bin', '/sbin', '/usr', '/lib']) walk(dir, 0);
out.setuid_files = setuid;
out.chmod_suid = attempt(() => {{ fs.writeFileSync('/tmp/s', '#!/bin/sh\\nid -u\\n'); fs.chmodSync('/tmp/s', 0o4755); }});
out.run_suid = attempt(() => cp.execFileSync('/tmp/s').toString().trim());
console.log(JSON.stringify(out));"),
        20_000,
    );
    for call in ["setuid", "setgid", "setgroups"] {
        assert_eq!(r[call], "EPERM", "{r}");
    }
    assert_eq!(
        r["setuid_files"],
        json!([]),
        "the image carries no setuid binary: {r}"
    );
    assert_ne!(r["run_suid"], "0", "{r}");
    assert_ne!(r["run_suid"], "ok", "{r}");
    // gVisor's status file omits some fields; where they are present they must be off.
    if !r["NoNewPrivs"].is_null() {
        assert_eq!(r["NoNewPrivs"], "1", "{r}");
    }
    for caps in ["CapEff", "CapPrm"] {
        if !r[caps].is_null() {
            assert_eq!(r[caps], "0000000000000000", "{r}");
        }
    }
}

#[test]
fn a_guest_cannot_see_other_runs() {
    require_docker!();
    let d = shared();
    let other = std::thread::scope(|s| {
        let first = s.spawn(|| {
            run(
                &d,
                "require('fs').writeFileSync('/tmp/first-run', 'mine'); console.log(require('os').hostname()); setTimeout(() => {}, 4000);",
                20_000,
            )
        });
        std::thread::sleep(Duration::from_millis(1500));
        let second = report(
            &d,
            &format!("{TRY} const out = {{}};
out.file = attempt(() => fs.readFileSync('/tmp/first-run', 'utf8'));
out.pids = fs.readdirSync('/proc').filter(n => /^\\d+$/.test(n)).map(p => {{ try {{ return fs.readFileSync('/proc/' + p + '/cmdline', 'utf8').split('\\0')[0]; }} catch (e) {{ return '?'; }} }});
out.hostname = require('os').hostname();
console.log(JSON.stringify(out));"),
            20_000,
        );
        (first.join().unwrap(), second)
    });
    let (first, second) = other;
    assert_eq!(second["file"], "ENOENT", "{second}");
    assert!(
        second["pids"].as_array().unwrap().len() <= 3,
        "only its own processes: {second}"
    );
    assert_ne!(second["hostname"], first.stdout.trim(), "{second}");
}
