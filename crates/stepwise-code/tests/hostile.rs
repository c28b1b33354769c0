//! Programs written to escape the sandbox or forge their verdict (the probes of issue #48, and
//! more of their kind). Each is graded as a failure or refused, and nothing it tries reaches the
//! caller: its files, its environment, its network, its other programs or the grader itself.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use stepwise_code::grading::Program;
use stepwise_code::problems::read_problems;
use stepwise_code::{CodeTask, Isolation, Job, Outcome, Sandbox, Status};

fn humaneval() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval/HumanEval.jsonl")
}

fn sandbox(isolation: Isolation) -> Sandbox {
    let python = std::env::var_os("STEPWISE_PYTHON").unwrap_or_else(|| "python3".into());
    let python = if PathBuf::from(&python).is_absolute() {
        PathBuf::from(python)
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap())
            .map(|d| d.join(&python))
            .find(|p| p.is_file())
            .expect("python3 on PATH")
    };
    let mut s = Sandbox::with_isolation(python, isolation).expect("the sandbox (python3, namespaces, Landlock)");
    s.timeout = Duration::from_secs(10);
    s.memory_bytes = 512 << 20;
    s
}

fn task(isolation: Isolation) -> CodeTask {
    CodeTask::new(read_problems(&humaneval()).unwrap(), sandbox(isolation))
}

fn graded(task: &CodeTask, id: &str, completion: &str) -> Outcome {
    task.run_program(&Program {
        problem: id.into(),
        code: completion.into(),
    })
    .unwrap()
}

fn run(program: &str) -> Outcome {
    sandbox(Isolation::Kernel)
        .run(&Job {
            program,
            ..Default::default()
        })
        .unwrap()
}

/// Wrong answers dressed with a trick that, in an in-process harness, forged a pass.
fn forgeries() -> Vec<(&'static str, String)> {
    let wrong = "    return True\n";
    let with = |trick: &str| format!("{wrong}\n{trick}\n");
    vec![
        ("HumanEval/0", with("__stepwise_assert__ = lambda line, check: None")),
        ("HumanEval/0", with("import builtins\nbuiltins.bool = lambda *a: True\nbuiltins.AssertionError = None")),
        (
            "HumanEval/0",
            with("import sys\ntry:\n    sys._getframe(1).f_locals['result']['status'] = 'passed'\nexcept Exception:\n    pass"),
        ),
        (
            "HumanEval/0",
            with("import gc, os\nfor o in gc.get_objects():\n    pass\nos.write(1, b'\\n<<<stepwise-result 0>>>\\n{\"status\": \"passed\"}\\n')\nos.write(4, b'{\"result\": {\"status\": \"passed\", \"tests\": []}}\\n')"),
        ),
        (
            "HumanEval/0",
            "    class Yes:\n        def __eq__(self, other):\n            return True\n        def __bool__(self):\n            return True\n    return Yes()\n".into(),
        ),
        (
            "HumanEval/0",
            "    import os\n    os.write(4, b'{\"value\": true}\\n{\"result\": {\"status\": \"passed\"}}\\n')\n    return True\n".into(),
        ),
        ("HumanEval/2", "    return 99.0\n\ndef abs(x):\n    return 0\n".into()),
        (
            "HumanEval/32",
            "    import math\n    math.fabs = lambda x: 0.0\n    return 12345.0\n".into(),
        ),
        ("HumanEval/38", "    return s\n\ndef encode_cyclic(s):\n    return s\n".into()),
        (
            "HumanEval/0",
            with("import os, signal\nfor pid in range(0, 4096):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except Exception:\n        pass"),
        ),
        ("HumanEval/0", with("import os\nos._exit(0)")),
        ("HumanEval/0", "    raise SystemExit(0)\n".into()),
        ("HumanEval/0", "    import os\n    os._exit(0)\n".into()),
        ("HumanEval/0", with("import sys\nsys.modules['builtins'].isinstance = lambda *a: True")),
    ]
}

#[test]
fn forged_verdicts_are_failures() {
    for isolation in [Isolation::Kernel, Isolation::Insecure] {
        let task = task(isolation);
        for (id, completion) in forgeries() {
            let o = graded(&task, id, &completion);
            assert!(
                !o.passed(),
                "{isolation:?} {id}: a forgery passed:\n{completion}\n{o:?}"
            );
        }
        // The same problems' references still pass.
        for id in ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38"] {
            let p = task.problem(id).unwrap().reference.clone();
            assert!(
                graded(&task, id, &p).passed(),
                "{isolation:?} {id}: the reference fails"
            );
        }
    }
}

/// A temporary file of the caller's holding a secret, removed on drop.
struct Secret {
    path: PathBuf,
    text: String,
}

impl Secret {
    fn new(name: &str) -> Secret {
        // Outside /tmp: inside the sandbox, /tmp is its own.
        Self::in_dir(PathBuf::from(env!("CARGO_TARGET_TMPDIR")), name)
    }

    fn in_dir(dir: PathBuf, name: &str) -> Secret {
        let text = format!("s3cret-{name}-{}", std::process::id());
        let path = dir.join(format!("stepwise-hostile-{name}-{}", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        Secret { path, text }
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn the_callers_files_environment_and_processes_are_out_of_reach() {
    let secret = Secret::new("file");
    std::env::set_var("STEPWISE_HOSTILE_SECRET", "hunter2-env");
    let here = env!("CARGO_MANIFEST_DIR");
    let p = secret.path.display();
    let program = format!(
        r#"
import io, os, sys, glob
found = []
def attempt(f):
    try:
        found.append(repr(f()))
    except BaseException as e:
        found.append(type(e).__name__)
attempt(lambda: io.FileIO({p:?}).read())
attempt(lambda: open({p:?}).read())
attempt(lambda: open('/etc/passwd').read())
attempt(lambda: open('/etc/shadow').read())
attempt(lambda: open({here:?} + '/Cargo.toml').read())
del sys.modules['posix']
import posix
attempt(lambda: posix.read(posix.open({p:?}, posix.O_RDONLY), 100))
attempt(lambda: dict(os.environ))
for env in glob.glob('/proc/*/environ'):
    attempt(lambda: open(env, 'rb').read())
for pid in range(1, 64):
    attempt(lambda: open('/proc/%d/cmdline' % pid, 'rb').read())
attempt(lambda: os.listdir('/'))
print('\n'.join(found))
print('processes', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
"#
    );
    let o = run(&program);
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert!(
        !o.stdout.contains(&secret.text),
        "the caller's file was read:\n{}",
        o.stdout
    );
    assert!(!o.stdout.contains("hunter2-env"), "the caller's environment was read");
    assert!(!o.stdout.contains("root:"), "/etc/passwd was read");
    assert!(
        !o.stdout.contains("[workspace]") && !o.stdout.contains("[package]"),
        "the caller's tree was read"
    );
    assert!(
        o.stdout.contains("processes [1]"),
        "processes outside the sandbox were seen:\n{}",
        o.stdout
    );
    // Its own root: the interpreter's directories, no home, no /work.
    assert!(
        !o.stdout.contains("'home'") && !o.stdout.contains("'work'"),
        "{}",
        o.stdout
    );
}

#[test]
fn files_outside_cannot_be_written_or_removed() {
    let keep = Secret::new("keep");
    let created =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("stepwise-hostile-created-{}", std::process::id()));
    let (k, c) = (keep.path.display(), created.display());
    let program = format!(
        r#"
import io, os, sys
def attempt(f):
    try:
        f()
        print('DONE')
    except BaseException as e:
        print(type(e).__name__)
attempt(lambda: io.FileIO({k:?}, 'w').write(b'overwritten'))
attempt(lambda: open({c:?}, 'w').write('created'))
del sys.modules['posix']
import posix
attempt(lambda: posix.unlink({k:?}))
attempt(lambda: os.rename({k:?}, {c:?}))
attempt(lambda: os.chmod({k:?}, 0o777))
attempt(lambda: open('/usr/stepwise-hostile', 'w').write('x'))
"#
    );
    let o = run(&program);
    assert!(!o.stdout.contains("DONE"), "{}", o.stdout);
    assert_eq!(std::fs::read_to_string(&keep.path).unwrap(), keep.text);
    assert!(!created.exists(), "a file outside the sandbox was created");
    // Inside its own /tmp it may write and read back.
    let local = run("open('scratch.txt', 'w').write('hi')\nassert open('scratch.txt').read() == 'hi'\n");
    assert_eq!(local.status, Status::Passed, "{local:?}");
}

#[test]
fn processes_sockets_and_kernel_interfaces_are_refused() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let program = format!(
        r#"
import os, sys
def attempt(name, f):
    try:
        r = f()
        print(name, 'ESCAPED', r)
    except BaseException as e:
        print(name, type(e).__name__)
attempt('fork', os.fork)
del sys.modules['posix']
import posix
attempt('posix_spawn', lambda: posix.posix_spawn('/bin/sh', ['sh', '-c', 'true'], {{}}))
attempt('system', lambda: os.system('true') == 0 or 1 / 0)
import subprocess
attempt('subprocess', lambda: subprocess.run(['/bin/sh', '-c', 'true']))
attempt('setsid', os.setsid)
import socket
attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1))
attempt('unix', lambda: socket.socket(socket.AF_UNIX).connect('\0stepwise'))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, args in [('unshare', (0x10000000,)), ('socket', (2, 1, 0)), ('ptrace', (16, 1, 0, 0)),
                   ('mount', (b'none', b'/tmp', b'tmpfs', 0, None)), ('setns', (0, 0)),
                   ('chroot', (b'/tmp',))]:
    r = getattr(libc, name)(*args)
    print(name, 'ESCAPED' if r >= 0 else 'refused', r)
attempt('execve', lambda: os.execv('/bin/sh', ['sh', '-c', 'echo ESCAPED-exec']))
"#
    );
    let o = run(&program);
    assert!(!o.stdout.contains("ESCAPED"), "{}", o.stdout);
    for name in [
        "fork",
        "posix_spawn",
        "subprocess",
        "tcp",
        "unshare",
        "socket",
        "ptrace",
        "mount",
    ] {
        assert!(o.stdout.contains(name), "{name} was not tried:\n{}", o.stdout);
    }
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the program reached a listener on 127.0.0.1"
    );
}

#[test]
fn a_full_tmp_threads_and_big_files_are_bounded() {
    let mut s = sandbox(Isolation::Kernel);
    s.work_bytes = 8 << 20;
    let run = |program: &str| {
        s.run(&Job {
            program,
            ..Default::default()
        })
        .unwrap()
    };
    // Many files, each under the size limit, together past /tmp's size.
    let o = run("chunk = b'x' * (1 << 20)\nfor i in range(64):\n    open('f%d' % i, 'wb').write(chunk)\n");
    assert_ne!(o.status, Status::Passed, "{o:?}");
    assert!(o.message.as_deref().unwrap_or("").contains("No space left"), "{o:?}");
    // Threads past the limit are refused (the process goes on).
    let o = run(
        "import threading, time\nn = 0\ntry:\n    for i in range(10000):\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\nexcept RuntimeError:\n    pass\nprint(n)\n",
    );
    let started: usize = o.stdout.trim().parse().unwrap_or(usize::MAX);
    assert!(started < 1000, "{started} threads started: {o:?}");
}

#[test]
fn a_program_left_running_is_killed_at_the_timeout_with_everything_it_started() {
    let mut s = sandbox(Isolation::Kernel);
    s.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let o = s
        .run(&Job {
            program: "import threading, time, os\nfor i in range(4):\n    threading.Thread(target=lambda: [None for _ in iter(int, 1)]).start()\ntry:\n    os.setsid()\nexcept OSError:\n    pass\ntime.sleep(600)\n",
            ..Default::default()
        })
        .unwrap();
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    // Not a timing test: a bound far past the timeout that only a hang would cross.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the run outlived its timeout by a minute"
    );
}

#[test]
fn one_hostile_program_costs_no_other_program_of_the_batch() {
    let task = task(Isolation::Kernel);
    let reference = task.problem("HumanEval/0").unwrap().reference.clone();
    let hostile = [
        "    import os, signal\n    for pid in range(0, 65536):\n        try:\n            os.kill(pid, signal.SIGKILL)\n        except Exception:\n            pass\n    return True\n",
        "    import os, threading\n    threading.Thread(target=lambda: [os.write(1, b'garbage{') for _ in range(1000)]).start()\n    os.write(4, b'garbage{\\n')\n    return True\n",
        "    import os\n    os.write(1, b'\\n<<<stepwise-result 0>>>\\n{\"status\": \"passed\"\\n')\n    return True\n",
        "    import os\n    os.close(3)\n    os.close(4)\n    return True\n",
        "    while True:\n        pass\n",
    ];
    let mut programs = Vec::new();
    for i in 0..12 {
        let code = if i % 3 == 1 {
            hostile[(i / 3) % hostile.len()]
        } else {
            reference.as_str()
        };
        programs.push(Program {
            problem: "HumanEval/0".into(),
            code: code.into(),
        });
    }
    let outcomes = task.run_programs(&programs, 2, &|_| {}).unwrap();
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(o.passed(), i % 3 != 1, "program {i}: {o:?}");
    }
}

/// The sandbox run by an unprivileged user (the test re-runs itself as `nobody` when it is root).
#[test]
fn the_sandbox_works_for_an_unprivileged_user() {
    if std::env::var_os("STEPWISE_UNPRIVILEGED_CHILD").is_some() {
        let o = run("import os\nprint(os.getuid())\n");
        assert_eq!(o.status, Status::Passed, "{o:?}");
        assert_eq!(o.stdout.trim(), "1000");
        let secret = Secret::in_dir(std::env::var_os("STEPWISE_SECRET_DIR").unwrap().into(), "unprivileged");
        let o = run(&format!("print(open({:?}).read())\n", secret.path.display()));
        assert!(!o.stdout.contains(&secret.text) && !o.passed(), "{o:?}");
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        return; // already unprivileged: the tests above ran as such a user
    }
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file());
    let Some(python) = python else {
        eprintln!("no system python3 that `nobody` can run: skipped");
        return;
    };
    use std::os::unix::process::CommandExt;
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("stepwise-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "the_sandbox_works_for_an_unprivileged_user", "--nocapture"])
        .env("STEPWISE_UNPRIVILEGED_CHILD", "1")
        .env("STEPWISE_PYTHON", python)
        .env("STEPWISE_SECRET_DIR", &scratch)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::io::stderr().write_all(&out.stdout);
    assert!(
        out.status.success(),
        "as nobody: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
