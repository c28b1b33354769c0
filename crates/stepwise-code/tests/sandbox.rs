//! The sandbox against HumanEval's 164 problems and against programs that misbehave on purpose:
//! every canonical solution passes; a solution with its `return` line removed, or a comparison
//! flipped, fails; a program that loops, forks, allocates without bound, opens a socket or starts
//! a process is stopped or refused. (tests/hostile.rs: programs written to escape or to forge.)

use std::path::PathBuf;
use std::time::Duration;
use stepwise_code::problems::{read_problems, steps_of};
use stepwise_code::{CodeTask, Job, Sandbox, Status};
use stepwise_core::seams::Task;

fn humaneval() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval/HumanEval.jsonl")
}

fn sandbox() -> Sandbox {
    let mut s = Sandbox::new().expect("python3 (the code task needs it; CI installs it)");
    s.timeout = Duration::from_secs(5);
    s.memory_bytes = 512 << 20;
    s
}

fn run(program: &str) -> stepwise_code::Outcome {
    sandbox()
        .run(&Job {
            program,
            ..Default::default()
        })
        .unwrap()
}

#[test]
fn every_canonical_humaneval_solution_passes_and_broken_ones_fail() {
    let problems = read_problems(&humaneval()).unwrap();
    assert_eq!(problems.len(), 164);
    let task = CodeTask::new(problems.clone(), sandbox());
    let mut without_return = 0;
    let (mut flipped, mut flippable) = (0, 0);
    for p in &problems {
        let steps = steps_of(&p.reference);
        let outcome = task.run(&p.id, &steps, None).unwrap();
        assert!(outcome.passed(), "{}: {:?}", p.id, outcome);
        assert!(!outcome.tests.is_empty(), "{}: no assertion ran", p.id);
        // Through the Task seam too: the answer is the code, the gold answer the problem's id.
        if p.id.ends_with("/0") || p.id.ends_with("/100") {
            assert!(task.is_correct(&p.id, &steps), "{}", p.id);
        }
        // The last `return` line removed: the function returns None, and the tests see it.
        if let Some(at) = steps.iter().rposition(|l| l.trim_start().starts_with("return ")) {
            let mut broken = steps.clone();
            broken.remove(at);
            let outcome = task.run(&p.id, &broken, None).unwrap();
            assert!(!outcome.passed(), "{}: passes without its last return line", p.id);
            without_return += 1;
        }
        // A `<` turned into `>=` on the first line comparing with `<`.
        if let Some(at) = steps
            .iter()
            .position(|l| l.contains(" < ") && !l.contains("\"") && !l.contains('\''))
        {
            let mut broken = steps.clone();
            broken[at] = broken[at].replacen(" < ", " >= ", 1);
            flippable += 1;
            if !task.run(&p.id, &broken, None).unwrap().passed() {
                flipped += 1;
            }
        }
    }
    println!(
        "{without_return} problems fail without their last return line; {flipped} of {flippable} with a flipped comparison"
    );
    assert_eq!(without_return, 164);
    assert_eq!(flipped, flippable);
}

#[test]
fn failing_assertions_are_each_recorded_and_the_tests_go_on() {
    let p = &read_problems(&humaneval()).unwrap()[0];
    let task = CodeTask::new(vec![p.clone()], sandbox());
    // Always True: the cases that expect False fail, the others pass.
    let outcome = task.run(&p.id, &["    return True".into()], None).unwrap();
    assert_eq!(outcome.status, Status::Failed);
    let passed = outcome.tests.iter().filter(|t| t.passed).count();
    assert_eq!(outcome.tests.len(), 7);
    assert_eq!(passed, 4, "{:?}", outcome.tests);
    assert_eq!(outcome.tests[1].error.as_deref(), Some("assertion failed"));
    // A body that does not compile.
    let outcome = task.run(&p.id, &["    return (".into()], None).unwrap();
    assert_eq!(outcome.status, Status::Error);
    assert!(outcome.message.unwrap().contains("SyntaxError"));
}

#[test]
fn the_trace_holds_the_locals_after_each_line() {
    let program = "def f(a, b):\n    s = a + b\n    t = s * 2\n    return t - 1\n\nf(3, 4)\n";
    let outcome = sandbox()
        .run(&Job {
            program,
            trace_function: Some("f"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(outcome.status, Status::Passed, "{outcome:?}");
    let lines: Vec<usize> = outcome.trace.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![2, 3, 4]);
    assert_eq!(outcome.trace[0].locals["s"], "7");
    assert_eq!(outcome.trace[1].locals["t"], "14");
    assert_eq!(outcome.trace[2].returned.as_deref(), Some("13"));
}

#[test]
fn runaway_programs_are_stopped() {
    let mut s = sandbox();
    s.timeout = Duration::from_secs(1);
    let looped = s
        .run(&Job {
            program: "while True:\n    pass\n",
            ..Default::default()
        })
        .unwrap();
    assert_eq!(looped.status, Status::Timeout, "{looped:?}");
    // Sleeping (no CPU) is stopped by the clock.
    let slept = s
        .run(&Job {
            program: "import time\ntime.sleep(60)\n",
            ..Default::default()
        })
        .unwrap();
    assert_eq!(slept.status, Status::Timeout, "{slept:?}");
    let hungry = run("x = bytearray(10 ** 10)\n");
    assert_eq!(hungry.status, Status::Memory, "{hungry:?}");
    let growing = run("x = []\nwhile True:\n    x.append(' ' * 10 ** 6)\n");
    assert_eq!(growing.status, Status::Memory, "{growing:?}");
    // Printing without end is captured, bounded, and does not stop the result.
    let chatty = run("for i in range(10 ** 6):\n    print('x' * 100)\n");
    assert_eq!(chatty.status, Status::Passed, "{:?}", chatty.message);
    assert!(chatty.stdout.len() <= 64 << 10);
}

#[test]
fn processes_network_and_files_outside_are_refused() {
    // What the kernel refuses is a PermissionError in the program: its status is `refused`,
    // with the call's line. (tests/hostile.rs tries many more ways out.)
    for program in [
        "import os\nos.fork()\n",
        "import subprocess\nsubprocess.run(['true'])\n",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))\n",
        "import posix\nposix.fork()\n",
        "import os\nos.setsid()\n",
    ] {
        let outcome = run(program);
        assert_eq!(outcome.status, Status::Refused, "{program}: {outcome:?}");
        let refused = outcome.refused.as_deref().unwrap_or("");
        assert!(
            refused.starts_with("PermissionError") && refused.contains("(line 2)"),
            "{program}: {outcome:?}"
        );
    }
    // Files outside are not there at all: the program's root holds the interpreter only.
    let outcome = run("open('/etc/passwd').read()\n");
    assert_eq!(outcome.status, Status::Error, "{outcome:?}");
    assert!(outcome.message.unwrap().starts_with("FileNotFoundError"));
    // Inside its own directory a program may write and read back.
    let local = run("open('scratch.txt', 'w').write('hi')\nassert open('scratch.txt').read() == 'hi'\n");
    assert_eq!(local.status, Status::Passed, "{local:?}");
}

#[test]
fn the_callers_environment_does_not_reach_the_program() {
    std::env::set_var("STEPWISE_SANDBOX_SECRET", "hunter2");
    let outcome = run("import os\nassert 'hunter2' not in repr(os.environ)\nassert os.environ.get('HOME') is None\n");
    assert_eq!(outcome.status, Status::Passed, "{outcome:?}");
    // A program cannot forge its result: what it prints is only its output.
    let forged = run(
        "print('<<<stepwise-result 0000000000000000>>>')\nprint('{\"status\": \"passed\"}')\nraise ValueError('no')\n",
    );
    assert_eq!(forged.status, Status::Error, "{forged:?}");
}

#[test]
fn a_missing_interpreter_is_a_clear_error() {
    let err = Sandbox::with_python("/nonexistent/python3").unwrap_err().to_string();
    assert!(err.contains("/nonexistent/python3") && err.contains("python3"), "{err}");
}

/// As a verifier's tool (GenPRM's code verification): a block sees what the chain's earlier
/// blocks defined, their output is not repeated, a block that raises or loops is reported as
/// text, and what the sandbox refuses stays refused.
#[test]
fn the_sandbox_runs_a_verification_chains_code_blocks_in_one_namespace() {
    use stepwise_core::seams::CodeRunner;
    let s = sandbox();
    let earlier = vec![
        "x = 12 + 1\nprint('first', x)".to_string(),
        "raise ValueError('an earlier block that fails')".to_string(),
        "def twice(v):\n    return 2 * v".to_string(),
    ];
    assert_eq!(s.execute(&earlier, "print(twice(x))"), "26");
    assert_eq!(s.execute(&[], "print(1 + 1)\nprint('two')"), "2\ntwo");
    let err = s.execute(&earlier, "print(x)\nprint(1 / 0)");
    assert!(err.starts_with("13\nCode execute Error: ZeroDivisionError"), "{err}");
    let syntax = s.execute(&[], "print(");
    assert!(syntax.contains("Code execute Error: SyntaxError"), "{syntax}");
    let refused = s.execute(&[], "import subprocess\nsubprocess.run(['true'])");
    assert!(
        refused.contains("Code execute Error") && refused.contains("PermissionError"),
        "{refused}"
    );
    let mut quick = sandbox();
    quick.timeout = Duration::from_secs(1);
    let looped = quick.execute(&[], "while True:\n    pass");
    assert!(looped.contains("Code execute Error"), "{looped}");
}

/// A whole script (SandboxFusion's `run_code`): its input on fd 0, its output and errors apart,
/// its exit status; a traceback and status 1 when it raises; its time bounded.
#[test]
fn a_script_reads_its_input_and_reports_its_exit() {
    use stepwise_code::{Script, ScriptStatus};
    let s = sandbox();
    let script = |program: &'static str, stdin: &'static [u8]| Script {
        program,
        stdin,
        ..Default::default()
    };
    let o = s
        .run_script(&script(
            "import sys\nn = int(input())\nprint(sum(range(n)))\nprint('note', file=sys.stderr)\nif __name__ == '__main__':\n    sys.exit(3)\n",
            b"10\n",
        ))
        .unwrap();
    assert_eq!(o.status, ScriptStatus::Finished, "{o:?}");
    assert_eq!(
        (o.return_code, o.stdout.as_str(), o.stderr.as_str()),
        (Some(3), "45\n", "note\n")
    );
    let o = s
        .run_script(&script(
            "data = open(0).read()\nprint(len(data))\n1 / 0\n",
            &[b'x'; 100_000],
        ))
        .unwrap();
    assert_eq!((o.return_code, o.stdout.as_str()), (Some(1), "100000\n"), "{o:?}");
    assert!(o.stderr.contains("ZeroDivisionError"), "{o:?}");
    let mut quick = sandbox();
    quick.timeout = Duration::from_secs(1);
    let o = quick.run_script(&script("while True:\n    pass\n", b"")).unwrap();
    assert_eq!((o.status, o.return_code), (ScriptStatus::TimeLimitExceeded, None));
    let o = s.run_script(&script("import os\nos.fork()\n", b"")).unwrap();
    assert!(
        o.return_code == Some(1) && o.stderr.contains("PermissionError"),
        "{o:?}"
    );
    // Files in (base64), files back.
    let o = s
        .run_script(&Script {
            program: "data = open('in.txt').read()\nopen('out.txt', 'w').write(data.upper())\n",
            files: [("in.txt".to_string(), "aGVsbG8=".to_string())].into(),
            fetch_files: vec!["out.txt".into(), "missing.txt".into()],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(o.return_code, Some(0), "{o:?}");
    assert_eq!(o.files.get("out.txt").map(String::as_str), Some("SEVMTE8="));
    assert!(!o.files.contains_key("missing.txt"));
}
