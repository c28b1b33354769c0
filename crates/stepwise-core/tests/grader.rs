//! The grader against OpenAI's PRM800K grader verdicts, GSM8K model solutions, ProcessBench
//! and MATH-500 gold answers.

mod common;
use common::data;
use serde_json::Value;
use std::collections::HashMap;
use stepwise_core::answer::{extract_answer, extract_gsm8k_gold};
use stepwise_core::calc::check_annotations;
use stepwise_core::grader::{grade, GradeMode};
use stepwise_core::io::raw_records;

fn records(rel: &str) -> Vec<Value> {
    raw_records(&data(rel)).unwrap().map(|(_, r)| r.unwrap()).collect()
}

#[test]
fn prm800k_mode_agrees_with_openai_grader_on_every_pair() {
    let mut misses = Vec::new();
    let pairs = records("grader/prm800k_pairs.jsonl");
    for p in &pairs {
        let (given, gt) = (p["given"].as_str().unwrap(), p["ground_truth"].as_str().unwrap());
        let want = p["prm800k_grader"].as_bool().unwrap();
        if grade(given, gt, GradeMode::Prm800k) != want {
            misses.push(format!("given {given:?} truth {gt:?}: expected {want}"));
        }
    }
    assert!(
        misses.is_empty(),
        "{} of {} pairs differ:\n{}",
        misses.len(),
        pairs.len(),
        misses.join("\n")
    );
}

#[test]
fn lenient_mode_is_mathematically_right_where_prm800k_is_strict() {
    for (given, gt) in [
        ("2^{10}", "1024"),
        ("\\sqrt[3]{8}", "2"),
        ("\\frac{2}{4}", "\\frac{1}{2}"),
        ("\\pm 2", "2, -2"),
        ("2, -2", "-2, 2"),
        ("\\binom{5}{2}", "10"),
        ("5!", "120"),
        ("10^2", "100"),
        ("\\frac{x+1}{2}", "\\frac{1}{2}(x+1)"),
        ("20\\%", "0.2"),
        ("5 dollars", "5"),
        ("inf", "\\infty"),
        ("\\infty", "\\inf"),
        ("-inf", "-\\infty"),
        ("∞", "\\infty"),
        ("infinity", "\\infty"),
        ("(-\\infty, 2]", "(-inf, 2]"),
    ] {
        assert!(grade(given, gt, GradeMode::Lenient), "lenient: {given} vs {gt}");
    }
    for (given, gt) in [
        ("x+1", "x+2"),
        ("(2,1)", "(1,2)"),
        ("(1,2)", "[1,2]"),
        ("0.333", "\\frac13"),
        ("yes", "no"),
        ("-\\infty", "\\infty"),
        ("-inf", "\\infty"),
        ("", ""),
        ("  ", ""),
        ("", "0"),
    ] {
        assert!(
            !grade(given, gt, GradeMode::Lenient),
            "lenient must reject: {given} vs {gt}"
        );
    }
}

/// Two different values are never equal because both are too large to hold exactly: not in
/// either mode, not through factorials, powers, binomials or long integers.
#[test]
fn values_too_large_to_hold_exactly_are_never_equal() {
    for (given, gt) in [
        ("171!", "172!"),
        ("(-2)^{127}", "-(-2)^{127}"),
        ("2^{200}", "2^{200}+1"),
        ("\\binom{1000}{500}", "\\binom{1000}{500}+1"),
        ("100000000000000000001", "100000000000000000000"),
        ("123456789012345678901234567890", "123456789012345678901234567891"),
        ("\\infty", "\\infty+1"),
    ] {
        for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
            assert!(!grade(given, gt, mode), "{mode:?}: {given} = {gt}");
        }
    }
    // Large integers are still equal to themselves, however their digits are padded.
    for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
        assert!(grade("100000000000000000001", "100000000000000000001", mode));
        assert!(
            grade("+00100000000000000000001", "100000000000000000001", mode),
            "{mode:?}"
        );
    }
}

#[test]
fn gsm8k_model_solutions_reproduce_is_correct() {
    let mut misses = Vec::new();
    let mut n = 0;
    let mut wrong_annotations = 0;
    let mut solutions_with_wrong_annotation = 0;
    for r in records("gsm8k/example_model_solutions.first300.jsonl") {
        let gold = r["ground_truth"]
            .as_str()
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .trim_start_matches("A:")
            .trim()
            .to_string();
        for key in [
            "6b_finetuning",
            "6b_verification",
            "175b_finetuning",
            "175b_verification",
        ] {
            let sol = r[key]["solution"].as_str().unwrap();
            let want = r[key]["is_correct"].as_bool().unwrap();
            n += 1;
            let given = extract_answer(sol).unwrap_or_default();
            if grade(&given, &gold, GradeMode::Prm800k) != want {
                misses.push(format!("{key}: extracted {given:?}, gold {gold:?}, expected {want}"));
            }
            let bad = check_annotations(sol).iter().filter(|a| !a.correct).count();
            wrong_annotations += bad;
            solutions_with_wrong_annotation += usize::from(bad > 0);
        }
    }
    assert_eq!(n, 1200);
    println!("calculator annotations: {solutions_with_wrong_annotation} of {n} solutions contain a wrong one ({wrong_annotations} wrong annotations)");
    assert!(misses.is_empty(), "{} misses:\n{}", misses.len(), misses.join("\n"));
}

#[test]
fn processbench_gsm8k_final_answers_reproduce_final_answer_correct() {
    let gold: HashMap<String, String> = records("gsm8k/test.jsonl")
        .into_iter()
        .map(|r| {
            (
                r["question"].as_str().unwrap().to_string(),
                extract_gsm8k_gold(r["answer"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    let pb = records("processbench/gsm8k.json");
    let mut hits = 0;
    let mut misses = Vec::new();
    for r in &pb {
        let problem = r["problem"].as_str().unwrap();
        let g = gold
            .get(problem)
            .unwrap_or_else(|| panic!("problem not in GSM8K test: {problem}"));
        let steps: Vec<&str> = r["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let last = steps.last().unwrap();
        let given = extract_answer(last)
            .or_else(|| extract_answer(&steps.join("\n\n")))
            .unwrap_or_default();
        let want = r["final_answer_correct"].as_bool().unwrap();
        if grade(&given, g, GradeMode::Prm800k) == want {
            hits += 1;
        } else {
            misses.push(format!("{}: extracted {given:?}, gold {g}, expected {want}", r["id"]));
        }
    }
    let rate = hits as f64 / pb.len() as f64;
    println!(
        "ProcessBench gsm8k final-answer agreement: {hits}/{} = {:.2}%",
        pb.len(),
        100.0 * rate
    );
    for m in &misses {
        println!("  miss {m}");
    }
    assert!(rate >= 0.985, "agreement {rate:.4} below 98.5%");
}

#[test]
fn math500_gold_answers_grade_equal_to_themselves_in_bounded_time() {
    for r in records("math500/test.jsonl") {
        let a = r["answer"].as_str().unwrap();
        assert!(grade(a, a, GradeMode::Prm800k), "prm800k: {a}");
        assert!(grade(a, a, GradeMode::Lenient), "lenient: {a}");
        // Extraction from the reference solution finds an answer the grader accepts.
        let sol = r["solution"].as_str().unwrap();
        let boxed = extract_answer(sol).unwrap();
        assert!(
            grade(&boxed, a, GradeMode::Lenient) || boxed.len() > 40,
            "extracted {boxed:?} vs {a:?}"
        );
    }
}

#[test]
fn adversarial_inputs_finish() {
    let tower = "2^{2^{2^{2^{2^{99}}}}}";
    for (a, b) in [
        (tower, "1"),
        ("9^9^9^9^9", "1"),
        ("100000!", "1"),
        (&"(".repeat(5000) as &str, "1"),
        (&"\\frac{".repeat(3000) as &str, "1"),
        (&"1+".repeat(20000) as &str, "1"),
        ("\\sqrt{\\sqrt{\\sqrt{\\sqrt{2}}}}", "2^{1/16}"),
    ] {
        for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
            let _ = grade(a, b, mode);
            let _ = grade(b, a, mode);
        }
    }
}

/// The lenient grader compares numbers by value whatever their notation, exactly (or to 12
/// significant digits for irrational values), small or large: PRM800K's grader, faithful to the
/// reference, rounds anything within 1e-7 of an integer to it.
#[test]
fn lenient_numbers_are_equal_by_value_whatever_the_notation() {
    use stepwise_core::grader::{grade, GradeMode::*};
    for (a, b, equal) in [
        ("3e-10", "5e-10", false),
        ("6.626e-34", "1.38e-23", false),
        ("1e-400", "2e-400", false),
        ("1e-400", "1e-400", true),
        ("10^{-10}", "5\\cdot10^{-10}", false),
        ("5\\cdot10^{-10}", "5e-10", true),
        ("3 \\times 10^{-10}", "3e-10", true),
        ("0.0000000003", "3e-10", true),
        ("1.5e3", "1500", true),
        ("\\frac{1}{3}", "0.3333333333", false),
        ("2, 3e-9", "3e-9, 2", true),
        ("50\\%", "0.5", true),
        ("0.0001", "0", false),
        ("\\frac{14}{3}.", "\\frac{14}{3}", true),
        ("3\\sqrt{13}.", "3\\sqrt{13}", true),
        ("5.", "5", true),
        ("1\\dfrac{4}{5}", "1\\frac{4}{5}", true),
        ("1\\dfrac{4}{5}", "\\frac{9}{5}", true),
    ] {
        assert_eq!(grade(a, b, Lenient), equal, "lenient: {a} vs {b}");
        assert_eq!(grade(b, a, Lenient), equal, "lenient: {b} vs {a}");
    }
    // PRM800K mode keeps the reference's verdicts.
    assert!(grade("3e-10", "5e-10", Prm800k));
}
