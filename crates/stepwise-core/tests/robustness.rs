//! Fuzz-style robustness: every reader and the grader on random and mutated inputs, for a
//! bounded number of iterations, must return (an error is fine) and never panic. The same
//! harness runs unbounded under `cargo fuzz` (see `fuzz/`).

mod common;
use common::data;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepwise_core::formats::ALL_FORMATS;
use stepwise_core::grader::{grade, GradeMode};

const ITERATIONS: usize = 3000;

/// Mutate bytes of a seed input: flips, deletions, duplications, insertions of syntax.
fn mutate(seed: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.random_range(1..8) {
        if v.is_empty() {
            v.push(b'{');
        }
        let i = rng.random_range(0..v.len());
        match rng.random_range(0..5) {
            0 => v[i] = rng.random(),
            1 => {
                v.remove(i);
            }
            2 => {
                let j = (i + rng.random_range(0..16)).min(v.len());
                let chunk = v[i..j].to_vec();
                v.splice(i..i, chunk);
            }
            3 => {
                let toks: [&[u8]; 10] = [
                    b"{", b"}", b"\\frac", b"^", b"(", b"]", b",", b"\\sqrt[", b"null", b"\"\"",
                ];
                let t = toks[rng.random_range(0..toks.len())];
                v.splice(i..i, t.iter().copied());
            }
            _ => v.truncate(i),
        }
    }
    v
}

#[test]
fn readers_never_panic_on_mutated_records() {
    let seeds: Vec<String> = [
        "prm800k/samples_openr.jsonl",
        "math_shepherd/samples_openr.jsonl",
        "openr/samples_math-aps-tree_openr.jsonl",
        "processbench/gsm8k.json",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(data(f)).unwrap().chars().take(3000).collect())
    .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for it in 0..ITERATIONS {
        let seed = seeds[it % seeds.len()].as_bytes();
        let bytes = mutate(seed, &mut rng);
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines().take(3) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                for f in ALL_FORMATS {
                    if let Ok(sols) = f.read(&v, 0) {
                        let _ = f.write(&sols);
                    }
                }
            }
        }
    }
}

#[test]
fn grader_never_panics_on_random_answers() {
    let atoms = [
        "\\frac", "{", "}", "1", "23", "-", "+", "^", "x", "\\sqrt", "[", "]", "(", ")", ",", "\\pi", "\\infty", "!",
        ".", "e", "\\text{", "\\$", "%", "\\left(", "\\right)", "\\pm", "\\binom", " ", "=", "/", "*", "9^9^9", "\\!",
        "∞", "é",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..ITERATIONS {
        let mut gen = || {
            (0..rng.random_range(0..12))
                .map(|_| atoms[rng.random_range(0..atoms.len())])
                .collect::<String>()
        };
        let (a, b) = (gen(), gen());
        for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
            let _ = grade(&a, &b, mode);
        }
    }
}

/// Values outside their domain are errors naming the file, the line and the field's path, in
/// every format that carries soft labels.
#[test]
fn soft_labels_outside_zero_one_are_errors_with_their_field() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-domain");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, record, field) in [
        (
            "stepwise.jsonl",
            r#"{"id":"a","problem_id":"p","question":"q","steps":[{"text":"x","label":{"p":0.5}},{"text":"y","label":{"p":1.5}}]}"#,
            "steps[1].label.p",
        ),
        (
            "negative.jsonl",
            r#"{"id":"a","problem_id":"p","question":"q","steps":[{"text":"x","label":{"p":-0.25}}]}"#,
            "steps[0].label.p",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "{{\"id\":\"ok\",\"problem_id\":\"p\",\"question\":\"q\",\"steps\":[{{\"text\":\"x\"}}]}}\n{record}\n"
            ),
        )
        .unwrap();
        let err = stepwise_core::io::read_solution_set(&path, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(":2") && err.contains(field), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A solution with more steps than any real chain is refused naming the file, the line and
/// `steps`, in every format, instead of being held in memory.
#[test]
fn absurd_step_counts_are_refused_with_their_line() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-many-steps");
    std::fs::create_dir_all(&dir).unwrap();
    let many: Vec<String> = (0..=stepwise_core::record::MAX_STEPS)
        .map(|i| format!("s{i}"))
        .collect();
    let under: Vec<String> = many[..100].to_vec();
    for (name, record) in [
        (
            "processbench.jsonl",
            serde_json::json!({"id": "b", "problem": "q", "steps": many, "label": -1, "final_answer_correct": true}),
        ),
        (
            "stepwise.jsonl",
            serde_json::json!({"id": "b", "problem_id": "p", "question": "q",
                               "steps": many.iter().map(|t| serde_json::json!({"text": t})).collect::<Vec<_>>()}),
        ),
    ] {
        let path = dir.join(name);
        let mut fine = record.clone();
        fine["id"] = "a".into();
        fine["steps"] = match &record["steps"][0] {
            serde_json::Value::String(_) => serde_json::json!(under),
            _ => serde_json::json!(under.iter().map(|t| serde_json::json!({"text": t})).collect::<Vec<_>>()),
        };
        std::fs::write(&path, format!("{fine}\n{record}\n")).unwrap();
        let err = stepwise_core::io::read_solution_set(&path, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(":2") && err.contains("`steps`") && err.contains("at most"),
            "{name}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Numbers survive a read and a write exactly: step scores (f32) and fields stepwise does not
/// know, kept verbatim (f64), on random bit patterns, including the ones a parser that is only
/// "within one ulp" gets wrong (serde_json's `float_roundtrip`).
#[test]
fn floats_survive_a_round_trip_exactly() {
    use stepwise_core::{Format, SolutionReader, SolutionWriter};
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-floats");
    std::fs::create_dir_all(&dir).unwrap();
    let (f64s, f32s): (Vec<f64>, Vec<f32>) = (0..20_000)
        .map(|_| {
            let a = f64::from_bits(rng.random::<u64>());
            let b = f32::from_bits(rng.random::<u32>());
            (
                if a.is_finite() { a } else { rng.random() },
                if b.is_finite() { b } else { rng.random() },
            )
        })
        .unzip();
    let input = dir.join("in.jsonl");
    let text: String = f64s
        .chunks(100)
        .zip(f32s.chunks(100))
        .enumerate()
        .map(|(i, (a, b))| {
            let steps: Vec<_> = b.iter().map(|s| serde_json::json!({"text": "x", "score": s})).collect();
            format!(
                "{}\n",
                serde_json::json!({"id": format!("r{i}"), "question": "q", "steps": steps, "values": a})
            )
        })
        .collect();
    std::fs::write(&input, &text).unwrap();
    let output = dir.join("out.jsonl");
    let mut writer = SolutionWriter::create(&output, Format::Stepwise).unwrap();
    for s in SolutionReader::open(&input, Some(Format::Stepwise)).unwrap() {
        writer.write(&s.unwrap()).unwrap();
    }
    writer.finish().unwrap();
    let (mut scores, mut values) = (Vec::new(), Vec::new());
    for line in std::fs::read_to_string(&output).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for s in v["steps"].as_array().unwrap() {
            scores.push(s["score"].as_f64().unwrap() as f32);
        }
        // A top-level field stepwise does not know is kept, in `meta`.
        values.extend(
            v["meta"]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap()),
        );
    }
    let changed_f32 = f32s
        .iter()
        .zip(&scores)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let changed_f64 = f64s
        .iter()
        .zip(&values)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        (changed_f32, changed_f64),
        (0, 0),
        "step scores and kept fields that changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_byte_order_mark_is_skipped_in_jsonl_json_and_arrays() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-bom");
    std::fs::create_dir_all(&dir).unwrap();
    let record = r#"{"id": "a", "question": "q", "steps": ["s"], "gold_answer": "1"}"#;
    for (name, body) in [
        ("lines.jsonl", format!("{record}\n{record}\n")),
        ("one.json", record.to_string()),
        ("array.json", format!("[{record}, {record}]")),
    ] {
        let path = dir.join(name);
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend_from_slice(body.as_bytes());
        std::fs::write(&path, bytes).unwrap();
        let read: Vec<_> = stepwise_core::io::raw_records(&path).unwrap().collect();
        assert!(!read.is_empty(), "{name}");
        for (_, r) in read {
            assert_eq!(r.unwrap()["id"], "a", "{name}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_parquet_page_whose_checksum_fails_is_an_error_not_other_data() {
    // Written by pyarrow with `write_page_checksum=True`, uncompressed: one flipped byte in a
    // step's text must not read back as a different step.
    let good = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/trl_checksummed.parquet");
    let bytes = std::fs::read(&good).unwrap();
    let read = |path: &std::path::Path| -> Result<Vec<serde_json::Value>, String> {
        let records = stepwise_core::io::raw_records(path).map_err(|e| e.to_string())?;
        records.map(|(_, r)| r.map_err(|e| e.to_string())).collect()
    };
    let rows = read(&good).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["completions"][0], "4 * 2 = 9");
    let at = bytes.windows(9).position(|w| w == b"4 * 2 = 9").unwrap() + 8;
    let mut flipped = bytes.clone();
    flipped[at] = b'8';
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-crc");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("flipped.parquet");
    std::fs::write(&bad, &flipped).unwrap();
    let e = read(&bad).expect_err("a corrupted page reads as an error");
    assert!(
        e.to_lowercase().contains("crc") || e.to_lowercase().contains("checksum"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
