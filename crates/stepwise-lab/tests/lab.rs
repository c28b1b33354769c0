//! The lab end to end (quick preset), and resumption of annotation after a crash.

use stepwise_lab::{run, LabOptions, Preset};

#[test]
fn quick_lab_writes_a_well_formed_report_and_resumes_from_its_records() {
    let out = std::env::temp_dir().join(format!("stepwise-lab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = LabOptions {
        preset: Preset::quick(),
        seed: 7,
        out: out.clone(),
    };
    let r = run(&o).unwrap();
    for f in [
        "metrics.json",
        "report.md",
        "report.html",
        "problems.jsonl",
        "samples_eval.jsonl",
        "labels_mc.jsonl",
        "scored_eval.jsonl",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap()).unwrap();
    let bon = m["bon"].as_array().unwrap();
    assert!(bon.iter().any(|c| c["method"] == "ORM") && bon.iter().any(|c| c["method"] == "majority vote"));
    for c in bon {
        for p in c["points"].as_array().unwrap() {
            let a = p["accuracy"].as_f64().unwrap();
            assert!(
                (0.0..=1.0).contains(&a)
                    && p["lo"].as_f64().unwrap() <= a + 1e-9
                    && a <= p["hi"].as_f64().unwrap() + 1e-9
            );
        }
    }
    assert_eq!(r.bon[0].points.last().unwrap().n, 8);
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("Best-of-N"));

    // A crash in the middle of annotation: keep the first records and half a line, rerun, and
    // the records must equal the uninterrupted run's.
    let labels = std::fs::read_to_string(out.join("labels_mc.jsonl")).unwrap();
    let lines: Vec<&str> = labels.lines().collect();
    assert!(lines.len() > 4);
    let torn = format!("{}\n{}", lines[..3].join("\n"), &lines[3][..lines[3].len() / 2]);
    std::fs::write(out.join("labels_mc.jsonl"), torn).unwrap();
    for stage in ["prm_mc", "prm_oracle", "orm"] {
        std::fs::remove_dir_all(out.join(stage)).unwrap();
    }
    let r2 = run(&o).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("labels_mc.jsonl")).unwrap(),
        labels,
        "resumed annotation differs"
    );
    assert_eq!(
        serde_json::to_string(&r.bon).unwrap(),
        serde_json::to_string(&r2.bon).unwrap(),
        "resumed run differs"
    );
    let _ = std::fs::remove_dir_all(&out);
}
