//! The lab's DPO stage in a quick run's folder, and `stepwise pairs --complete-with` against it.

use super::read;
use std::path::Path;
use std::process::Command;

/// DPO on each source's pairs: five policies measured, the step pairs' precision from the
/// oracle (1 for its own), the Monte Carlo pairs once as mined and once with sampled right steps
/// added (Step-DPO's rectification), each paired with outcome-level DPO and with the start, a
/// folder each.
pub fn check_dpo(a: &Path, m: &serde_json::Value) {
    let dpo = &m["dpo"];
    let v = dpo["variants"].as_array().unwrap();
    let names: Vec<&str> = v.iter().map(|v| v["pairs_from"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "outcome",
            "step_mc",
            "step_mc_sampled",
            "step_mc_sampled_checked",
            "step_omegaprm",
            "step_oracle"
        ]
    );
    for v in v {
        let acc = v["accuracy_after"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc) && v["pairs"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["precision"].is_null(), v["pairs_from"] == "outcome", "{v}");
        assert!(a
            .join(format!("dpo_{}", v["pairs_from"].as_str().unwrap()))
            .join("dpo_state.json")
            .exists());
    }
    assert_eq!(v[5]["precision"], 1.0);
    // The sampled pairs come on top of the mined ones, and only there.
    let sampled = v[2]["sampled"].as_u64().unwrap();
    assert!(sampled > 0, "{}", v[2]);
    assert_eq!(
        v[2]["pairs"].as_u64().unwrap(),
        v[1]["pairs"].as_u64().unwrap() + sampled
    );
    let q = &v[2]["sampled_quality"];
    assert_eq!(q["pairs"].as_u64().unwrap(), sampled);
    let (p, c, r) = (
        q["precision"].as_f64().unwrap(),
        q["chosen_right"].as_f64().unwrap(),
        q["rejected_wrong"].as_f64().unwrap(),
    );
    assert!(p <= c.min(r) && c <= 1.0 && r <= 1.0 && p >= 0.0, "{q}");
    // The check keeps some of the sampled steps, and no others.
    let checked = v[3]["sampled"].as_u64().unwrap();
    assert!(checked <= sampled, "{}", v[3]);
    assert!(
        v.iter().enumerate().all(|(i, v)| i == 2 || i == 3 || v["sampled"] == 0),
        "{dpo}"
    );
    assert_eq!(
        dpo["paired"].as_array().unwrap().len(),
        12 + usize::from(checked > 0),
        "five against outcome DPO, six against the start, the sampled against the mined"
    );
    assert!(read(a.join("report.md")).contains("## DPO on each label source's pairs"));
}

/// `stepwise pairs --complete-with policy` on the lab's Monte Carlo labels, with the lab's seed
/// for it (seed ^ 11), its rollouts a place and its policy's sampling, samples the same right
/// steps the lab's DPO stage added, and with `--check-rollouts` keeps the same ones.
pub fn the_command_line_rectifies_as_the_lab_does(root: &Path, a: &Path) {
    for (check, dir) in [("0", "dpo_step_mc_sampled"), ("2", "dpo_step_mc_sampled_checked")] {
        let out = root.join(format!("pairs_sampled_{check}.jsonl"));
        let run = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .arg("pairs")
            .arg(a.join("labels_mc.jsonl"))
            .arg(&out)
            .args([
                "--samples",
                "2",
                "--seed",
                "12",
                "--separator",
                " | ",
                "--temperature",
                "1",
            ])
            .args(["--max-tokens", "64", "--check-rollouts", check, "--complete-with"])
            .arg(a.join("policy"))
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(err.contains("continuations reached the gold answer"), "{err}");
        let sampled = |text: String| -> Vec<(String, String, String)> {
            (text.lines())
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|p| p["chosen_source"] == "sampled")
                .map(|p| {
                    let s = |k: &str| p[k].as_str().unwrap().to_string();
                    (s("id"), s("chosen"), s("rejected"))
                })
                .collect()
        };
        let cli = sampled(read(out));
        assert!(check != "0" || !cli.is_empty());
        assert_eq!(
            cli,
            sampled(read(a.join(dir).join("sampled_pairs.jsonl"))),
            "the command line's sampled right steps differ from the lab's ({dir})"
        );
    }
}
