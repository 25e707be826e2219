//! Hostile candidates against the exec sandbox (docs/sandbox.md). Each attack
//! must be contained, scored non-pass, leave no process of the candidate uid
//! behind, and leave the sandbox working: the next normal job passes.
//!
//! Needs bubblewrap and root (the candidate runs under a uid of its own);
//! each test builds its own one-worker sandbox with its own uid so the
//! process checks cannot see another test's candidates.

use std::io::ErrorKind as IoKind;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use falcon_rl::config::{ExecClock, ExecConfig};
use falcon_rl::exec::{ErrorKind, ExecReport, RewardClass, Sandbox, TestStatus};
use falcon_rl::task::Task;

const ADD: &str = "def f(a, b):\n    return a + b\n";

fn task(tests: &[&str]) -> Task {
    crate::common::task_of("adversarial", tests)
}

fn add_task() -> Task {
    task(&["assert f(1, 2) == 3", "assert f(-1, 1) == 0"])
}

/// A one-worker sandbox whose candidate uid is `uid`; candidates that sleep
/// are stopped after 3 s of wall time.
fn sandbox(uid: u32) -> Sandbox {
    let cfg = ExecConfig {
        workers: 1,
        uid_base: uid,
        timeout_s: 1.0,
        wall_timeout_s: 3.0,
        memory_mb: 512,
        ..ExecConfig::default()
    };
    Sandbox::new(&cfg).unwrap_or_else(|e| panic!("sandbox: {e}"))
}

/// Live (non-zombie) processes owned by `uid`, seen from the host.
fn procs_of_uid(uid: u32) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(e.path()) else {
            continue;
        };
        if meta.uid() != uid {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .map(|(_, r)| r.chars().next().unwrap_or('?'));
        if state != Some('Z') && !stat.is_empty() {
            out.push(stat);
        }
    }
    out
}

/// The checks every attack must satisfy.
fn assert_contained(sb: &Sandbox, uid: u32, report: &ExecReport, what: &str) {
    assert!(
        report.no_signal.is_none(),
        "{what}: sandbox broke: {report:?}"
    );
    assert_ne!(
        report.outcome,
        Some(RewardClass::Pass),
        "{what}: scored as pass: {report:?}"
    );
    assert!(report.n_pass() < report.tests.len(), "{what}: {report:?}");
    // Processes die with their job, not some time later.
    let left = procs_of_uid(uid);
    assert!(left.is_empty(), "{what}: processes left behind: {left:?}");
    let next = sb.run(&add_task(), ADD);
    assert_eq!(
        next.outcome,
        Some(RewardClass::Pass),
        "{what}: next job: {next:?}"
    );
}

fn first_kind(r: &ExecReport) -> Option<ErrorKind> {
    r.error_kind
}

/// The error kind of one test's result (`None` for a pass or a wrong answer).
fn kind_of(status: &TestStatus) -> Option<ErrorKind> {
    match status {
        TestStatus::Error { kind, .. } => Some(*kind),
        _ => None,
    }
}

#[test]
fn infinite_loop_times_out_with_its_line() {
    let sb = sandbox(62000);
    let t0 = Instant::now();
    let r = sb.run(
        &task(&["assert f(1, 2) == 3"]),
        "def f(a, b):\n    while True:\n        a += 1\n",
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    assert!(
        r.error_lines.iter().all(|l| (2..=3).contains(l)) && !r.error_lines.is_empty(),
        "{r:?}"
    );
    // A loop at top level, and one that ignores our timer signal.
    let r2 = sb.run(
        &task(&["assert f(1, 2) == 3"]),
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
    );
    assert_eq!(first_kind(&r2), Some(ErrorKind::Timeout), "{r2:?}");
    assert_contained(&sb, 62000, &r, "infinite loop");
}

#[test]
fn fork_bomb_is_contained() {
    let sb = sandbox(62010);
    let code = "import os\ndef f(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n";
    let t0 = Instant::now();
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), code);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_contained(&sb, 62010, &r, "fork bomb");
}

#[test]
fn memory_bomb_is_a_memory_error() {
    let sb = sandbox(62020);
    let code = "def f(a, b):\n    x = []\n    while True:\n        x.append(bytearray(10**7))\n";
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), code);
    assert_eq!(first_kind(&r), Some(ErrorKind::MemoryError), "{r:?}");
    assert_eq!(r.error_lines, vec![4], "{r:?}");
    assert_contained(&sb, 62020, &r, "memory bomb");
}

#[test]
fn disk_fill_is_capped() {
    let sb = sandbox(62030);
    let code = "def f(a, b):\n    i = 0\n    while True:\n        with open('fill%d' % i, 'wb') as fh:\n            fh.write(b'x' * (1 << 20))\n        i += 1\n";
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), code);
    assert!(
        matches!(r.tests[0].status, TestStatus::Error { .. }),
        "{r:?}"
    );
    // One big file hits the file-size limit instead.
    let big = "def f(a, b):\n    open('big', 'wb').write(b'x' * (200 << 20))\n";
    let r2 = sb.run(&task(&["assert f(1, 2) == 3"]), big);
    assert!(
        matches!(r2.tests[0].status, TestStatus::Error { .. }),
        "{r2:?}"
    );
    assert_contained(&sb, 62030, &r, "disk fill");
}

#[test]
fn network_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = sandbox(62040);
    let code = format!(
        "import socket\ndef f(a, b):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n    s.sendall(b'hi')\n    return a + b\n"
    );
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), &code);
    assert!(
        matches!(&r.tests[0].status, TestStatus::Error { .. }),
        "{r:?}"
    );
    match listener.accept() {
        Err(e) if e.kind() == IoKind::WouldBlock => {}
        other => panic!("the candidate reached the host: {other:?}"),
    }
    let dns = "import socket\ndef f(a, b):\n    socket.getaddrinfo('example.com', 80)\n    return a + b\n";
    let r2 = sb.run(&task(&["assert f(1, 2) == 3"]), dns);
    assert_ne!(r2.outcome, Some(RewardClass::Pass), "{r2:?}");
    assert_contained(&sb, 62040, &r, "network connect");
}

#[test]
fn writes_outside_the_work_dir_fail() {
    let sb = sandbox(62050);
    let stamp = format!("falcon-exec-probe-{}", std::process::id());
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let targets = [
        format!("/etc/{stamp}"),
        format!("{home}/{stamp}"),
        format!("{}/{stamp}", env!("CARGO_MANIFEST_DIR")),
        format!("/var/tmp/{stamp}"),
        format!("/tmp/{stamp}"),
    ];
    for target in &targets {
        let code =
            format!("def f(a, b):\n    open({target:?}, 'w').write('pwned')\n    return a + b\n");
        let r = sb.run(&task(&["assert f(1, 2) == 3"]), &code);
        assert!(
            matches!(&r.tests[0].status, TestStatus::Error { .. }),
            "{target}: {r:?}"
        );
        assert_eq!(r.error_lines, vec![2], "{r:?}");
        assert!(
            !Path::new(target).exists(),
            "{target} was written on the host"
        );
    }
    let r = sb.run(
        &task(&["assert f(1, 2) == 3"]),
        "import os\nos.unlink('/etc/hostname')\n",
    );
    assert_contained(&sb, 62050, &r, "write outside");
}

#[test]
fn killing_the_parent_fails() {
    let sb = sandbox(62060);
    for attack in [
        "os.kill(os.getppid(), signal.SIGKILL)",
        "os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
        "os.kill(1, signal.SIGKILL)",
        "os.kill(-1, signal.SIGKILL)",
        "os.killpg(0, signal.SIGKILL)",
    ] {
        // The attack, then a wrong answer: whatever the attack does, the
        // trusted side must survive to score it (no "no signal").
        let code = format!("import os, signal\ndef f(a, b):\n    {attack}\n    return a * b\n");
        let r = sb.run(&task(&["assert f(1, 2) == 3"]), &code);
        assert_contained(&sb, 62060, &r, attack);
    }
}

#[test]
fn daemon_does_not_outlive_its_job() {
    let sb = sandbox(62070);
    // Double fork + setsid: the daemon leaves the candidate's process group.
    let code = "import os, time\ndef f(a, b):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n            while True:\n                time.sleep(0.01)\n        os._exit(0)\n    time.sleep(5)\n";
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), code);
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    assert_contained(&sb, 62070, &r, "daemon");
    // A daemon started by code that otherwise passes is killed too.
    let quiet = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\ndef f(a, b):\n    return a + b\n";
    let r = sb.run(&add_task(), quiet);
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    assert!(procs_of_uid(62070).is_empty(), "{:?}", procs_of_uid(62070));
}

#[test]
fn a_gigabyte_of_output_is_capped() {
    let sb = sandbox(62080);
    let code = "import sys\ndef f(a, b):\n    for _ in range(1024):\n        sys.stdout.write('x' * (1 << 20))\n    return a + b\n";
    let t0 = Instant::now();
    let r = sb.run(&task(&["assert f(1, 2) == 3"]), code);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        r.output_tail.len() <= sb.config().output_bytes,
        "{}",
        r.output_tail.len()
    );
    assert_contained(&sb, 62080, &r, "1 GB of output");
}

#[test]
fn sys_exit_before_the_tests_is_not_a_pass() {
    let sb = sandbox(62090);
    for code in [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "def f(a, b):\n    raise SystemExit(0)\n",
        "import sys\ndef f(a, b):\n    sys.exit(0)\n",
    ] {
        let r = sb.run(&add_task(), code);
        assert_eq!(r.n_pass(), 0, "{code}: {r:?}");
        assert_contained(&sb, 62090, &r, code);
    }
}

#[test]
fn eq_returning_true_is_a_wrong_answer() {
    let sb = sandbox(62100);
    let code = "class Any:\n    def __eq__(self, o):\n        return True\n    def __bool__(self):\n        return True\n    __hash__ = None\ndef f(a, b):\n    return Any()\n";
    let t = task(&[
        "assert f(1, 2) == 3",
        "assert f(1, 2)",
        "assert 3 == f(1, 2)",
        "assert f(1, 2) in [3]",
    ]);
    let r = sb.run(&t, code);
    // Comparisons never trust candidate code. A bare truth test asks the
    // child for a plain bool, which `assert f(x)` accepts by design (a
    // function returning True passes it too), so test 1 passes.
    for i in [0, 2, 3] {
        assert_ne!(r.tests[i].status, TestStatus::Pass, "test {i}: {r:?}");
    }
    assert_eq!(r.tests[0].status, TestStatus::Fail, "{r:?}");
    assert_eq!(r.tests[1].status, TestStatus::Pass, "{r:?}");
    // Subclasses of plain types arrive as their plain value.
    let sub = "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(a, b):\n    return I(7)\n";
    let r2 = sb.run(&task(&["assert f(1, 2) == 3"]), sub);
    assert_eq!(r2.tests[0].status, TestStatus::Fail, "{r2:?}");
    assert_contained(&sb, 62100, &r, "__eq__ returning True");
}

#[test]
fn patching_builtins_changes_nothing_on_the_trusted_side() {
    let sb = sandbox(62110);
    let code = "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 3\nbuiltins.abs = lambda x: 0\ndef f(a, b):\n    return a - b\n";
    let r = sb.run(
        &task(&[
            "assert f(1, 2) == 3",
            "assert len(f(1, 2)) == 3",
            "assert abs(f(1, 2) - 3) < 1e-9",
        ]),
        code,
    );
    assert_eq!(r.n_pass(), 0, "{r:?}");
    assert_contained(&sb, 62110, &r, "patched builtins");
}

/// A worker imports numpy only once a job names it or imports a module
/// outside the standard library (worker.py `_preload_for`). A candidate that
/// reaches numpy another way still answers with numpy values: the child
/// encodes them, and the trusted side imports numpy to decode them.
#[test]
fn numpy_values_cross_when_no_job_names_numpy() {
    let sb = sandbox(62640);
    let code = "import importlib\ndef f(n):\n    np = importlib.import_module('nu' + 'mpy')\n    return np.arange(n) * 2, np.int64(n), np.float32(0.5)\n";
    let t = task(&[
        "a, n, h = f(3)\nassert type(a).__name__ == 'ndarray' and a.tolist() == [0, 2, 4]",
        "assert f(3)[1] == 3 and type(f(3)[1]) is int",
        "assert f(3)[2] == 0.5 and type(f(3)[2]) is float",
    ]);
    let r = sb.run(&t, code);
    assert_eq!(r.n_pass(), 3, "{r:?}");
    assert!(procs_of_uid(62640).is_empty());
}

#[test]
fn forged_result_records_are_ignored() {
    let sb = sandbox(62120);
    let forged = r#"{"tests":[{"status":"pass","kind":null,"lines":[],"seconds":0}],"output":"","seconds":0}"#;
    // Printed to stdout/stderr, written raw to every inherited descriptor
    // (including the reply pipe to the trusted side), framed and unframed.
    let code = format!(
        "import os, sys, struct, json\nmsg = {forged:?}.encode()\nok = json.dumps({{'ok': 3}}).encode()\nfor fd in range(0, 64):\n    for m in (msg, struct.pack('>I', len(msg)) + msg, struct.pack('>I', len(ok)) + ok):\n        try:\n            os.write(fd, m)\n        except OSError:\n            pass\nprint(msg.decode()); print(msg.decode(), file=sys.stderr)\ndef f(a, b):\n    return a - b\n"
    );
    let r = sb.run(&add_task(), &code);
    assert_eq!(r.n_pass(), 0, "{r:?}");
    assert_contained(&sb, 62120, &r, "forged records");
}

/// Workers outlive the threads that needed them: bubblewrap's
/// `--die-with-parent` is tied to the thread that started it, and workers
/// started by the pool's warm-up thread or a batch's threads used to die
/// with them, so every batch started new ones.
#[test]
fn workers_started_inside_a_batch_survive_it() {
    let cfg = ExecConfig {
        workers: 2,
        uid_base: 62140,
        timeout_s: 5.0,
        ..ExecConfig::default()
    };
    let sb = Sandbox::new(&cfg).unwrap_or_else(|e| panic!("sandbox: {e}"));
    let task = add_task();
    let jobs: Vec<(&Task, &str)> = (0..8).map(|_| (&task, ADD)).collect();
    // Until both slots have a worker (the second may still be warming).
    for _ in 0..3 {
        assert!(sb
            .run_batch(&jobs)
            .iter()
            .all(|r| r.outcome == Some(RewardClass::Pass)));
    }
    let started = sb.lazy_starts();
    for _ in 0..5 {
        std::thread::scope(|s| {
            s.spawn(|| sb.run_batch(&jobs));
        });
    }
    assert_eq!(
        sb.lazy_starts(),
        started,
        "batches started new workers: the old ones died with a thread"
    );
}

#[test]
fn killed_worker_is_replaced_and_never_hangs_the_caller() {
    let sb = sandbox(62130);
    assert_eq!(sb.run(&add_task(), ADD).outcome, Some(RewardClass::Pass));
    // Kill the worker (found by the uid in its limits argument) from outside.
    let marker = "\"uid\":62130";
    let mut killed = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(marker) {
            let pid: i32 = e.file_name().to_string_lossy().parse().unwrap_or(0);
            if pid > 0 && pid as u32 != std::process::id() {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
    }
    assert!(killed > 0, "no worker found");
    let t0 = Instant::now();
    let r = sb.run(&add_task(), ADD);
    assert!(t0.elapsed() < Duration::from_secs(30));
    // A dead idle worker is replaced before the job is sent to it, or the
    // job that could not be sent runs again on a freshly started worker:
    // either way the sample runs.
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    let r = sb.run(&add_task(), ADD);
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
}

#[test]
fn per_test_results_error_kinds_and_lines() {
    let sb = sandbox(62140);
    let code = "def f(a, b):\n    if a == 0:\n        return {}[b]\n    if a == 1:\n        return a + b\n    return 1 / (a - a)\n";
    let t = task(&[
        "assert f(1, 2) == 3",
        "assert f(1, 2) == 4",
        "assert f(0, 1) == 1",
        "assert f(2, 2) == 0",
    ]);
    let r = sb.run(&t, code);
    assert_eq!((r.n_pass(), r.n_fail()), (1, 3), "{r:?}");
    assert_eq!(r.tests[1].status, TestStatus::Fail);
    assert_eq!(
        r.tests[1].error_lines,
        (1..=6).collect::<Vec<u32>>(),
        "wrong answer: the called function's lines"
    );
    assert_eq!(
        kind_of(&r.tests[2].status),
        Some(ErrorKind::KeyError),
        "{r:?}"
    );
    assert_eq!(r.tests[2].error_lines, vec![3]);
    assert_eq!(
        kind_of(&r.tests[3].status),
        Some(ErrorKind::ZeroDivisionError),
        "{r:?}"
    );
    assert_eq!(r.tests[3].error_lines, vec![6]);
    let syn = sb.run(&t, "def f(a, b):\n    return a +\n");
    assert_eq!(syn.outcome, Some(RewardClass::SyntaxError));
    assert_eq!(syn.error_lines, vec![2]);
    let ind = sb.run(&t, "def f(a, b):\nreturn a\n");
    assert_eq!(ind.error_kind, Some(ErrorKind::IndentationError));
    // In-place mutation of arguments is seen by the test; candidate-defined
    // objects travel as handles (MBPP's Node trees).
    let inplace = task(&["x = [3, 1, 2]\nf(x, 0)\nassert x == [1, 2, 3]"]);
    let r = sb.run(&inplace, "def f(x, _):\n    x.sort()\n");
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    let mut tree = task(&["assert f(root, 0) == 2"]);
    tree.test_setup = Some("root = Node(1)\nroot.left = Node(2)".into());
    let r = sb.run(&tree, "class Node:\n    def __init__(self, v):\n        self.v = v\n        self.left = None\ndef f(n, _):\n    return n.left.v\n");
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    // The task's prelude (its prompt's imports) runs first, in the
    // candidate's process, and the candidate's line numbers do not move.
    let mut typed = task(&["assert f([1, 2], 0) == 3", "assert f([], 1) == 0"]);
    let code = "def f(xs: List[int], k: int) -> int:\n    if k:\n        return {}[k]\n    return sum(xs)\n";
    let r = sb.run(&typed, code);
    assert_eq!(
        r.error_kind,
        Some(ErrorKind::NameError),
        "no prelude: {r:?}"
    );
    typed.prelude = Some("import math\nfrom typing import List".into());
    let r = sb.run(&typed, code);
    assert_eq!(r.tests[0].status, TestStatus::Pass, "{r:?}");
    assert_eq!(
        kind_of(&r.tests[1].status),
        Some(ErrorKind::KeyError),
        "{r:?}"
    );
    assert_eq!(r.tests[1].error_lines, vec![3]);
    typed.prelude = Some("from typing import (".into());
    let r = sb.run(&typed, code);
    assert!(
        r.no_signal.is_some(),
        "a broken prelude is the task's fault: {r:?}"
    );
}

#[test]
fn run_batch_keeps_order() {
    let sb = Sandbox::new(&ExecConfig {
        workers: 2,
        uid_base: 62150,
        timeout_s: 1.0,
        ..ExecConfig::default()
    })
    .unwrap();
    let t = add_task();
    let good = ADD.to_owned();
    let bad = "def f(a, b):\n    return a * b\n".to_owned();
    let jobs: Vec<(&Task, &str)> = (0..20)
        .map(|i| {
            (
                &t,
                if i % 3 == 0 {
                    bad.as_str()
                } else {
                    good.as_str()
                },
            )
        })
        .collect();
    let rs = sb.run_batch(&jobs);
    for (i, r) in rs.iter().enumerate() {
        let want = if i % 3 == 0 {
            Some(RewardClass::Failure)
        } else {
            Some(RewardClass::Pass)
        };
        assert_eq!(r.outcome, want, "{i}: {r:?}");
    }
}

/// A counter the candidate keeps in a global shows which tests shared a
/// process: with `reuse_child` (the default) passing tests share one and a
/// failing test's successor starts fresh; without it every test starts fresh.
#[test]
fn tests_share_a_process_only_while_they_pass() {
    let code = "n = 0\ndef f():\n    global n\n    n += 1\n    print('call', n)\n    return n\n";
    let t = Task {
        entry_point: "f".into(),
        ..task(&[
            "assert f() == 1",
            "assert f() == 2",
            "assert f() == 99",
            "assert f() == 1",
        ])
    };
    let status = |r: &ExecReport| -> Vec<bool> {
        r.tests
            .iter()
            .map(|t| t.status == TestStatus::Pass)
            .collect()
    };
    let reuse = sandbox(62160);
    let r = reuse.run(&t, code);
    assert_contained(&reuse, 62160, &r, "reuse_child = true");
    assert_eq!(status(&r), [true, true, false, true], "{r:?}");
    // Output of every process of the job is kept, in order.
    let calls: Vec<&str> = r.output_tail.lines().collect();
    assert_eq!(calls, ["call 1", "call 2", "call 3", "call 1"], "{r:?}");

    let cfg = ExecConfig {
        workers: 1,
        uid_base: 62170,
        timeout_s: 1.0,
        memory_mb: 512,
        reuse_child: false,
        ..ExecConfig::default()
    };
    let fresh = Sandbox::new(&cfg).unwrap();
    let r = fresh.run(&t, code);
    assert_contained(&fresh, 62170, &r, "reuse_child = false");
    assert_eq!(status(&r), [true, false, false, true], "{r:?}");
}

/// A timed-out test's successor gets a fresh process and its own full time
/// budget, also when earlier tests shared a process.
#[test]
fn reused_process_gets_a_fresh_time_budget_per_test() {
    let cfg = ExecConfig {
        workers: 1,
        uid_base: 62180,
        timeout_s: 1.0,
        memory_mb: 512,
        clock: ExecClock::Wall,
        ..ExecConfig::default()
    };
    let sb = Sandbox::new(&cfg).unwrap_or_else(|e| panic!("sandbox: {e}"));
    let code = "import time\ndef f(s):\n    time.sleep(s)\n    return s\n";
    let t = task(&[
        "assert f(0.6) == 0.6",
        "assert f(0.6) == 0.6",
        "assert f(5) == 5",
        "assert f(0.6) == 0.6",
    ]);
    let r = sb.run(&t, code);
    assert_contained(&sb, 62180, &r, "sleeps");
    let kinds: Vec<Option<ErrorKind>> = r
        .tests
        .iter()
        .map(|t| match &t.status {
            TestStatus::Error { kind, .. } => Some(*kind),
            TestStatus::Fail => Some(ErrorKind::WrongAnswer),
            TestStatus::Pass => None,
        })
        .collect();
    assert_eq!(kinds, [None, None, Some(ErrorKind::Timeout), None], "{r:?}");
}

/// The default CPU clock: sleeping costs no budget, working does, and a
/// candidate that sleeps past the wall-clock backstop, or silences our CPU
/// timer and spins, still times out. The wall clock counts the same sleep.
#[test]
fn cpu_clock_counts_work_not_sleep() {
    let cpu = ExecConfig {
        workers: 1,
        uid_base: 62610,
        timeout_s: 1.0,
        wall_timeout_s: 6.0,
        memory_mb: 512,
        ..ExecConfig::default()
    };
    assert_eq!(cpu.clock, ExecClock::Cpu);
    let sb = Sandbox::new(&cpu).unwrap_or_else(|e| panic!("sandbox: {e}"));
    let naps = "import time\ndef f(a, b):\n    time.sleep(1.5)\n    return a + b\n";
    let r = sb.run(&add_task(), naps);
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    let burns = "import time\ndef f(a, b):\n    t = time.process_time()\n    \
                 while time.process_time() - t < 5:\n        pass\n    return a + b\n";
    let one = task(&["assert f(1, 2) == 3"]);
    let r = sb.run(&one, burns);
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    // The timer counts the scheduler's exact runtime: 0.7 s of work fits a
    // 1 s limit, and the limit fires after a full second of it (ITIMER_PROF,
    // charged in whole ticks, fired after 0.8 s on a shared CPU).
    let r = sb.run(&one, &burns.replace("< 5", "< 0.7"));
    assert_eq!(r.outcome, Some(RewardClass::Pass), "{r:?}");
    let clocked = "import time\ndef f(a, b):\n    t = time.process_time()\n    try:\n        \
                   while True:\n            pass\n    except BaseException:\n        \
                   raise ValueError(time.process_time() - t)\n";
    let r = sb.run(&one, clocked);
    let used: f64 = match &r.tests[0].status {
        TestStatus::Error { message, .. } => message.parse().unwrap_or(-1.0),
        _ => -1.0,
    };
    assert!(
        (0.98..1.5).contains(&used),
        "fired after {used} s of CPU: {r:?}"
    );
    let t0 = Instant::now();
    let sleeper = "import time\ndef f(a, b):\n    time.sleep(30)\n    return a + b\n";
    let r = sb.run(&one, sleeper);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    assert!(
        matches!(&r.tests[0].status, TestStatus::Error { message, .. }
            if message.contains("wall-clock limit of 6s")),
        "{r:?}"
    );
    let deaf = "import signal\nfor s in (signal.SIGALRM, signal.SIGPROF):\n    signal.signal(s, signal.SIG_IGN)\n\
                def f(a, b):\n    while True:\n        pass\n";
    let r = sb.run(&one, deaf);
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    assert_contained(&sb, 62610, &r, "silenced CPU timer");

    let wall = ExecConfig {
        clock: ExecClock::Wall,
        uid_base: 62620,
        ..cpu
    };
    let sb = Sandbox::new(&wall).unwrap_or_else(|e| panic!("sandbox: {e}"));
    let r = sb.run(&one, naps);
    assert_eq!(first_kind(&r), Some(ErrorKind::Timeout), "{r:?}");
    assert_contained(&sb, 62620, &r, "nap on the wall clock");
}

/// `isolation = "none"` (no namespaces; warns once) still runs jobs in
/// forked children with rlimits and reports per-test results.
#[test]
fn isolation_none_runs_jobs_with_rlimits() {
    let cfg = ExecConfig {
        workers: 1,
        uid_base: 62190,
        timeout_s: 1.0,
        memory_mb: 512,
        isolation: falcon_rl::config::Isolation::None,
        ..ExecConfig::default()
    };
    let sb = Sandbox::new(&cfg).unwrap_or_else(|e| panic!("sandbox: {e}"));
    let ok = sb.run(&add_task(), ADD);
    assert_eq!(ok.outcome, Some(RewardClass::Pass), "{ok:?}");
    let wrong = sb.run(&add_task(), "def f(a, b):\n    return a - b\n");
    assert_eq!(wrong.error_kind, Some(ErrorKind::WrongAnswer), "{wrong:?}");
    let bomb = sb.run(
        &add_task(),
        "def f(a, b):\n    x = bytearray(4 << 30)\n    return a + b\n",
    );
    assert_eq!(bomb.error_kind, Some(ErrorKind::MemoryError), "{bomb:?}");
    let slow = sb.run(&add_task(), "def f(a, b):\n    while True:\n        pass\n");
    assert_eq!(slow.error_kind, Some(ErrorKind::Timeout), "{slow:?}");
    assert!(procs_of_uid(62190).is_empty(), "{:?}", procs_of_uid(62190));
}
