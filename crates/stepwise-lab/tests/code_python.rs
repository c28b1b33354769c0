//! The code domain's interpreter against `python3` itself (in the code task's sandbox): the same
//! programs — references, slipped ones, and ones broken on purpose (lines dropped or swapped, a
//! name never assigned, a keyword assigned, a zero divisor) — return the same values on the five
//! calls or fail alike, and the execution trace (each line's stored value, per call) matches
//! Python's.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use stepwise_code::{Job, Sandbox, Status};
use stepwise_lab::code::{answer, run, Effect, PARAMS, PROBES};
use stepwise_lab::task::{noisy_reference, Domain};

fn sandbox() -> Sandbox {
    let mut s = Sandbox::new().expect("python3 (the code task needs it; CI installs it)");
    s.timeout = Duration::from_secs(60);
    s
}

fn function(body: &[String]) -> String {
    let mut src = format!("def f({}):\n", PARAMS.join(", "));
    for line in body {
        src.push_str(&format!("    {line}\n"));
    }
    src
}

/// Programs a policy of the lab may write, and worse.
fn programs() -> Vec<Vec<String>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut out = Vec::new();
    for i in 0..300 {
        let p = Domain::Code.generate(&mut rng, i);
        out.push(p.steps.clone());
        out.push(noisy_reference(&p, &mut rng, 1.0));
        let mut broken = p.steps.clone();
        let j = rng.random_range(0..broken.len());
        match rng.random_range(0..5) {
            0 => {
                broken.remove(j);
            }
            1 => {
                let k = rng.random_range(0..broken.len());
                broken.swap(j, k);
            }
            2 => broken[j] = broken[j].replacen(" a", " q", 1),
            3 => broken.insert(
                j,
                ["is = 3", "x = a % 0", "y = b > 9", "x ="]
                    .choose(&mut rng)
                    .unwrap()
                    .to_string(),
            ),
            _ => broken.push("return a".into()),
        }
        out.push(broken);
    }
    out
}

#[test]
fn python_returns_what_the_interpreter_returns() {
    let programs = programs();
    let sources: Vec<String> = programs.iter().map(|p| function(p)).collect();
    let probes: Vec<Vec<i64>> = PROBES.iter().map(|c| c.to_vec()).collect();
    // One Python run for all of them: each compiled and called on its own, a failure printed.
    let program = format!(
        "SOURCES = {}\nPROBES = {:?}\nfor src in SOURCES:\n    try:\n        ns = {{}}\n        exec(src, ns)\n        outs = [ns['f'](*args) for args in PROBES]\n        print('NONE' if any(o is None for o in outs) else ' '.join(repr(o) for o in outs))\n    except Exception as e:\n        print('ERROR ' + type(e).__name__)\n",
        serde_json::to_string(&sources).unwrap(),
        probes
    );
    let outcome = sandbox()
        .run(&Job {
            program: &program,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(outcome.status, Status::Passed, "{outcome:?}");
    let printed: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(printed.len(), programs.len());
    let (mut values, mut failures) = (0, 0);
    for (p, py) in programs.iter().zip(printed) {
        match answer(p) {
            Some(a) => {
                assert_eq!(a, py, "{p:?}");
                values += 1;
            }
            None => {
                assert!(py == "NONE" || py.starts_with("ERROR"), "{p:?}: Python gave {py}");
                failures += 1;
            }
        }
    }
    assert!(values > 700 && failures > 50, "{values} {failures}");
}

#[test]
fn the_trace_is_pythons() {
    let sandbox = sandbox();
    let mut compared = 0;
    for p in programs().iter().step_by(37).filter(|p| answer(p).is_some()) {
        let calls: Vec<String> = PROBES
            .iter()
            .map(|c| format!("f({})", c.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")))
            .collect();
        let program = format!("{}\n{}\n", function(p), calls.join("\n"));
        let outcome = sandbox
            .run(&Job {
                program: &program,
                trace_function: Some("f"),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(outcome.status, Status::Passed, "{outcome:?}");
        for (i, effect) in run(p).iter().enumerate() {
            let line = i + 2; // the body starts on the program's second line
            let events: Vec<_> = outcome.trace.iter().filter(|e| e.line == line).collect();
            match effect {
                Effect::Stored(v) => {
                    let name = p[i].split_whitespace().next().unwrap();
                    assert_eq!(events.len(), PROBES.len(), "{p:?} line {line}");
                    for (call, e) in events.iter().enumerate() {
                        let want = match (v.boolean, v.calls[call]) {
                            (true, 0) => "False".to_string(),
                            (true, _) => "True".to_string(),
                            (false, x) => x.to_string(),
                        };
                        assert_eq!(e.locals[name], want, "{p:?} line {line} call {}", call + 1);
                    }
                    compared += 1;
                }
                Effect::Returned(v) => {
                    let returned: Vec<&str> = events.iter().filter_map(|e| e.returned.as_deref()).collect();
                    assert_eq!(returned.join(" "), v.show(), "{p:?}");
                }
                Effect::Unreached => assert!(events.is_empty(), "{p:?} line {line}"),
                Effect::Failed => unreachable!("a program with a value fails nowhere before its return"),
            }
        }
    }
    assert!(compared > 40, "{compared}");
}
