//! Step labels by execution: HumanEval's reference solutions with one operator flipped in one
//! line are labelled by binary search and by Monte Carlo through `CodeTask`, with a completer
//! that continues any prefix with the rest of the reference. The first error must be the flipped
//! line exactly, wherever the flip makes the tests fail. MBPP-shaped records are read and run.

use std::collections::HashMap;
use std::path::PathBuf;
use stepwise_code::problems::{read_problems, steps_of};
use stepwise_code::{CodeTask, Sandbox};
use stepwise_core::seams::{Annotator, Task};
use stepwise_core::testing::ScriptedPolicy;
use stepwise_core::{Solution, Step};
use stepwise_label::{BinarySearch, McOptions, MonteCarlo};

fn humaneval() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval/HumanEval.jsonl")
}

/// `line` with its first comparison or arithmetic operator flipped, if it has one.
fn flipped(line: &str) -> Option<String> {
    [
        (" < ", " >= "),
        (" > ", " <= "),
        (" == ", " != "),
        (" + ", " - "),
        (" - ", " + "),
        (" * ", " + "),
    ]
    .iter()
    .find(|(from, _)| line.contains(from))
    .map(|(from, to)| line.replacen(from, to, 1))
}

#[test]
fn a_flipped_line_is_the_first_error_that_execution_finds() {
    let problems = read_problems(&humaneval()).unwrap();
    let task = CodeTask::new(problems.clone(), Sandbox::new().unwrap());
    let references: HashMap<String, Vec<String>> = problems
        .iter()
        .map(|p| (p.prompt.clone(), steps_of(&p.reference)))
        .collect();
    // The completer: whatever the prefix, the rest of the reference solution.
    let completer =
        ScriptedPolicy(|question: &str, prefix: &[&str], _j: usize| references[question][prefix.len()..].to_vec());
    let options = McOptions { rollouts: 1, seed: 0 };
    let bisect = BinarySearch {
        policy: &completer,
        task: &task,
        options: options.clone(),
    };
    let mc = MonteCarlo {
        policy: &completer,
        task: &task,
        options,
    };
    let (mut checked, mut harmless) = (0, 0);
    for p in problems.iter().take(40) {
        let lines = steps_of(&p.reference);
        let Some((k, bad)) = lines.iter().enumerate().find_map(|(k, l)| flipped(l).map(|b| (k, b))) else {
            continue;
        };
        let mut steps = lines.clone();
        steps[k] = bad;
        let sol = Solution {
            id: p.id.clone(),
            problem_id: p.id.clone(),
            question: p.prompt.clone(),
            steps: steps.iter().map(Step::new).collect(),
            gold_answer: Some(p.id.clone()),
            ..Default::default()
        };
        if task.is_correct(&p.id, &steps) {
            harmless += 1; // the tests do not see this flip
            continue;
        }
        let (by_bisection, _) = bisect.annotate(&sol).unwrap();
        assert_eq!(by_bisection.first_error(), Some(k), "{}: binary search", p.id);
        let (by_rollouts, _) = mc.annotate(&sol).unwrap();
        assert_eq!(by_rollouts.first_error(), Some(k), "{}: Monte Carlo", p.id);
        checked += 1;
    }
    eprintln!("{checked} flips the tests catch, each found at its line; {harmless} the tests do not see");
    assert!(
        checked >= 15,
        "{checked} flipped solutions failed their tests ({harmless} harmless)"
    );
}

#[test]
fn mbpp_records_are_read_and_run() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-code-mbpp");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mbpp.jsonl");
    let records = [
        serde_json::json!({
            "task_id": 2, "text": "Write a function to find the shared elements from the given two lists.",
            "code": "def similar_elements(a, b):\n    res = tuple(sorted(set(a) & set(b)))\n    return res",
            "test_list": ["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
                          "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)"],
            "test_setup_code": "", "challenge_test_list": []
        }),
        serde_json::json!({
            "task_id": 3, "text": "Write a python function to identify non-prime numbers.",
            "code": "import math\ndef is_not_prime(n):\n    for i in range(2, int(math.sqrt(n)) + 1):\n        if n % i == 0:\n            return True\n    return False",
            "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True", "assert is_not_prime(35) == True"],
            "test_setup_code": ""
        }),
    ];
    std::fs::write(&file, records.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let problems = read_problems(&file).unwrap();
    assert_eq!(
        problems.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["MBPP/2", "MBPP/3"]
    );
    assert!(
        problems.iter().all(|p| p.header.is_empty()),
        "an MBPP solution is the whole function"
    );
    let task = CodeTask::new(problems.clone(), Sandbox::new().unwrap());
    for p in &problems {
        let steps = steps_of(&p.reference);
        assert!(task.is_correct(&p.id, &steps), "{}: the reference passes", p.id);
        let outcome = task.run(&p.id, &steps, None).unwrap();
        assert_eq!(outcome.tests.len(), p.tests.asserts.len(), "each assertion reported");
        let mut wrong = steps.clone();
        let last = wrong.len() - 1;
        wrong[last] = wrong[last].replace("False", "True").replace("res", "()");
        assert!(!task.is_correct(&p.id, &wrong), "{}: a changed return fails", p.id);
    }
    // A record of neither shape is named by file and line.
    std::fs::write(&file, "{\"task_id\": 1, \"text\": \"t\"}\n").unwrap();
    let e = format!("{:#}", read_problems(&file).unwrap_err());
    assert!(e.contains("mbpp.jsonl:1") && e.contains("MBPP"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
