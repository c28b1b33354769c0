//! Readers and writers on real records of every format, round trips, and conversions.

mod common;
use common::{data, scratch};
use serde_json::{json, Value};
use stepwise_core::formats::ALL_FORMATS;
use stepwise_core::io::raw_records;
use stepwise_core::{read_solutions, write_solutions, Format, Rating, Solution};

fn raw(path: &std::path::Path) -> Vec<Value> {
    raw_records(path).unwrap().map(|(_, r)| r.unwrap()).collect()
}

/// Read a file, write it back in its own format, and compare record by record.
fn assert_lossless(path: &std::path::Path, format: Format) -> Vec<Solution> {
    let original = raw(path);
    assert_eq!(Format::detect(&original[0]), Some(format), "{}", path.display());
    let sols = read_solutions(path, None).unwrap();
    let dir_tmp = scratch(&format!("lossless-{format}"));
    let dir = dir_tmp.path();
    let out = dir.join("out.jsonl");
    write_solutions(&out, format, &sols).unwrap();
    let back = raw(&out);
    assert_eq!(back.len(), original.len(), "{format}: record count");
    for (i, (a, b)) in original.iter().zip(&back).enumerate() {
        assert_eq!(a, b, "{format}: record {i} differs after a round trip");
    }
    // And through stepwise's own format and back.
    let native = dir.join("native.jsonl");
    write_solutions(&native, Format::Stepwise, &sols).unwrap();
    let again = read_solutions(&native, None).unwrap();
    assert_eq!(again, sols);
    sols
}

#[test]
fn prm800k_real_records_round_trip() {
    let sols = assert_lossless(&data("prm800k/samples_openr.jsonl"), Format::Prm800k);
    assert_eq!(sols.len(), 6);
    // First record: step 2 has no chosen completion; the human completion is followed.
    assert_eq!(sols[0].steps[1].text, "We have $3p+e=1.24$ and $5p+e=1.82$.");
    assert_eq!(sols[0].steps[1].label, None);
    assert_eq!(sols[0].gold_answer.as_deref(), Some("29"));
    assert_eq!(sols[0].final_answer.as_deref(), Some("29"));
    // The phase-2 record that found an error ends on a step rated -1.
    let found = sols
        .iter()
        .find(|s| s.meta["prm800k"]["label"]["finish_reason"] == "found_error")
        .unwrap();
    assert_eq!(
        found.steps.last().unwrap().label.as_ref().unwrap().rating(),
        Some(Rating::Bad)
    );
    // The pretty-printed phase-2 test example reads as a JSON document too.
    let one = read_solutions(data("prm800k/phase2_test_example_tongyx361.json"), None).unwrap();
    assert_eq!(one.len(), 1);
    assert!(one[0].first_error().is_some());
}

#[test]
fn math_shepherd_real_records_round_trip() {
    let sols = assert_lossless(&data("math_shepherd/samples_openr.jsonl"), Format::MathShepherd);
    assert_eq!(sols.len(), 7);
    assert!(sols[0].question.starts_with("Janet pays $40/hour"));
    assert_eq!(sols[0].steps.len(), 5);
    assert!(sols[0].steps[0].text.starts_with("Step 1: Janet spends"));
    assert!(sols[1].steps.iter().all(|s| !s.label.as_ref().unwrap().is_good()));
}

#[test]
fn openr_prm_layout_round_trips() {
    let sols = assert_lossless(&data("math_shepherd/openr_prm_test_toy.json"), Format::OpenrPrm);
    assert_eq!(sols[0].steps.len(), 4);
    assert_eq!(sols[0].first_error(), Some(3));
}

/// TRL's conversational layout: the prompt as messages (the question is the last user turn),
/// completions as assistant messages; written back with the same prompt messages.
#[test]
fn trl_conversational_records_read_and_round_trip() {
    let dir_tmp = scratch("trl-conversational");
    let dir = dir_tmp.path();
    let path = dir.join("in.jsonl");
    let record = json!({
        "prompt": [{"role": "system", "content": "Think step by step."},
                   {"role": "user", "content": "What is 2 + 3?"}],
        "completions": ["2 + 3 = 5.", "The answer is 5."],
        "labels": [true, true],
        "id": "c1",
    });
    std::fs::write(&path, format!("{record}\n")).unwrap();
    assert_lossless(&path, Format::Trl);
    let as_messages = json!({
        "prompt": [{"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]}],
        "completions": [[{"role": "assistant", "content": "2 + 3 = 6."}], {"role": "assistant", "content": "So 6."}],
        "labels": [false, false],
    });
    std::fs::write(&path, format!("{as_messages}\n")).unwrap();
    let sols = read_solutions(&path, None).unwrap();
    assert_eq!(sols[0].question, "What is 2 + 3?");
    assert_eq!(sols[0].step_texts(), ["2 + 3 = 6.", "So 6."]);
    let no_user = json!({"prompt": [{"role": "system", "content": "x"}], "completions": ["a"], "labels": [true]});
    std::fs::write(&path, format!("{no_user}\n")).unwrap();
    let err = read_solutions(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("in.jsonl:1") && err.contains("prompt") && err.contains("user message"),
        "{err}"
    );
}

#[test]
fn omegaprm_flat_and_tree_round_trip() {
    let flat = assert_lossless(&data("openr/samples_math-aps_openr.jsonl"), Format::OmegaPrm);
    assert!(flat.iter().any(|s| s.steps.len() > 3));
    // OmegaPRM's values come from its tree search, and say so.
    let labels: Vec<_> = flat
        .iter()
        .flat_map(|s| &s.steps)
        .filter_map(|st| st.label.as_ref())
        .collect();
    assert!(!labels.is_empty());
    for l in labels {
        assert_eq!(serde_json::to_value(&l.source).unwrap()["kind"], "omegaprm");
    }
    let tree = assert_lossless(&data("openr/samples_math-aps-tree_openr.jsonl"), Format::OmegaPrmTree);
    assert!(tree.iter().all(|s| s.steps.iter().all(|st| st.label.is_some())));
}

#[test]
fn processbench_real_files_round_trip_and_convert_everywhere() {
    for file in ["processbench/gsm8k.json", "processbench/math.json"] {
        let path = data(file);
        let sols = read_solutions(&path, None).unwrap();
        let original = raw(&path);
        assert_eq!(sols.len(), original.len());
        let dir_tmp = scratch(&format!("pb-{}", file.replace('/', "-")));
        let dir = dir_tmp.path();
        // Own format: exact.
        let out = dir.join("pb.json");
        write_solutions(&out, Format::ProcessBench, &sols).unwrap();
        assert_eq!(raw(&out), original);
        // Every other format and back: what ProcessBench holds survives (problem, steps,
        // first-error label).
        // HumanEval holds code and tests, no labels: not a place for ProcessBench's records.
        // Nor are the trajectory layouts, which need observations between the steps.
        let chat = [Format::HumanEval, Format::Messages, Format::Conversations];
        for f in ALL_FORMATS.into_iter().filter(|f| !chat.contains(f)) {
            let p = dir.join(format!("{f}.jsonl"));
            write_solutions(&p, f, &sols).unwrap();
            let back = read_solutions(&p, Some(f)).unwrap();
            let back = if f.groups_by_problem() {
                // Grouped formats hold every prefix; keep the full solutions.
                back.into_iter()
                    .filter(|s| {
                        sols.iter()
                            .any(|o| o.question == s.question && o.step_texts() == s.step_texts())
                    })
                    .collect::<Vec<_>>()
            } else {
                back
            };
            assert_eq!(back.len(), sols.len(), "{file} via {f}: count");
            for (a, b) in sols.iter().zip(&back) {
                assert_eq!(a.question, b.question, "{file} via {f}: question of {}", a.id);
                assert_eq!(
                    a.step_texts().len(),
                    b.step_texts().len(),
                    "{file} via {f}: steps of {}",
                    a.id
                );
                assert_eq!(
                    a.first_error(),
                    b.first_error(),
                    "{file} via {f}: first error of {}",
                    a.id
                );
            }
            // Through TRL's layout, whole records come back: ids, generators and outcomes too.
            if f == Format::Trl {
                let again = dir.join("trl-back.json");
                write_solutions(&again, Format::ProcessBench, &back).unwrap();
                assert_eq!(raw(&again), original, "{file} via trl");
            }
        }
    }
}

#[test]
fn hand_written_records_of_each_format_round_trip() {
    let records: Vec<(Format, Value)> = vec![
        (
            Format::Trl,
            json!({"prompt": "What is 2+3?", "completions": ["2+3=5.", "So 5."], "labels": [true, true], "id": "0"}),
        ),
        (
            Format::Rlhflow,
            json!({"conversations": [
            {"role": "user", "content": "What is 2+3? Step 1: 2+3=6."}, {"role": "assistant", "content": "-"},
            {"role": "user", "content": "Step 2: The answer is 6."}, {"role": "assistant", "content": "-"}]}),
        ),
        (
            Format::ProcessBench,
            json!({"id": "x-1", "generator": "me", "problem": "P", "steps": ["a", "b", "c"], "final_answer_correct": false, "label": 1}),
        ),
        (
            Format::MathShepherd,
            json!({"input": "Q? Step 1: a ки\nStep 2: b ки", "label": "Q? Step 1: a +\nStep 2: b -", "task": "GSM8K"}),
        ),
        (
            Format::OpenrPrm,
            json!({"question": "Q", "process": "Step 1: a ки\nStep 2: b ки", "labels": [1, 0]}),
        ),
        (
            Format::OmegaPrmTree,
            json!({"question": "Q", "final_answer": "4", "reasoning_steps": {"text": "Q", "mc_value": 0.5, "children": [
            {"text": "a", "mc_value": 1.0, "children": []}, {"text": "b", "mc_value": 0.0, "children": [{"text": "c", "mc_value": 0.0, "children": []}]}]}}),
        ),
        (
            Format::OmegaPrm,
            json!({"question": "Q", "final_answer": "4", "reasoning_steps": [
            {"solution_prefix": "Q", "mc_value": 0.5}, {"solution_prefix": "Q\n\na", "mc_value": 1.0}, {"solution_prefix": "Q\n\nb", "mc_value": 0.0}]}),
        ),
    ];
    for (f, v) in records {
        assert_eq!(Format::detect(&v), Some(f), "detect {v}");
        let sols = f.read(&v, 0).unwrap();
        let back = f.write(&sols).unwrap();
        assert_eq!(back, vec![v.clone()], "{f}");
        let native: Vec<Solution> = sols
            .iter()
            .map(|s| serde_json::from_value(serde_json::to_value(s).unwrap()).unwrap())
            .collect();
        assert_eq!(native, sols);
    }
}

#[test]
fn parquet_round_trip_keeps_records() {
    let path = data("processbench/gsm8k.json");
    let sols = read_solutions(&path, None).unwrap();
    let dir_tmp = scratch("parquet");
    let dir = dir_tmp.path();
    for f in [Format::Stepwise, Format::Trl, Format::ProcessBench] {
        let p = dir.join(format!("{f}.parquet"));
        write_solutions(&p, f, &sols).unwrap();
        let back = read_solutions(&p, Some(f)).unwrap();
        assert_eq!(back.len(), sols.len());
        for (a, b) in sols.iter().zip(&back) {
            assert_eq!(a.step_texts(), b.step_texts());
            assert_eq!(a.first_error(), b.first_error());
        }
    }
}

/// Records that differ in which optional fields they have (one scored, one not; meta in one
/// only, with different keys) come back from Parquet as they went in: the nulls Arrow gives the
/// fields a record lacks read as absent.
#[test]
fn parquet_keeps_records_with_fields_some_lack() {
    let mut sols = read_solutions(data("processbench/gsm8k.json"), None).unwrap();
    sols.truncate(4);
    let n = sols[0].steps.len();
    sols[0].scores.insert("prm".into(), vec![0.5; n]);
    sols[1].meta.insert("score_errors".into(), json!({"prm": "too long"}));
    sols[2].meta.insert("note".into(), json!({"by": "a labeller"}));
    let p_tmp = scratch("parquet-sparse");
    let p = p_tmp.path().join("sparse.parquet");
    write_solutions(&p, Format::Stepwise, &sols).unwrap();
    let back = read_solutions(&p, Some(Format::Stepwise)).unwrap();
    assert_eq!(back, sols);
}

#[test]
fn bad_input_names_file_line_and_field() {
    let dir_tmp = scratch("bad");
    let dir = dir_tmp.path();
    let p = dir.join("bad.jsonl");
    std::fs::write(
        &p,
        "{\"prompt\": \"q\", \"completions\": [\"a\"], \"labels\": [true]}\n{not json\n{\"prompt\": \"q\", \"completions\": [\"a\", \"b\"], \"labels\": [true, 7]}\n",
    )
    .unwrap();
    let errs: Vec<String> = stepwise_core::SolutionReader::open(&p, None)
        .unwrap()
        .filter_map(|r| r.err())
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("bad.jsonl:2") && errs[0].contains("invalid JSON"),
        "{}",
        errs[0]
    );
    assert!(
        errs[1].contains("bad.jsonl:3") && errs[1].contains("labels[1]"),
        "{}",
        errs[1]
    );
    let mut r = stepwise_core::SolutionReader::open(&p, None)
        .unwrap()
        .skip_invalid(true);
    let ok: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(ok.len(), 1);
    assert_eq!(r.skipped(), 2);
    let one = std::fs::read_to_string(&p).unwrap().lines().nth(2).unwrap().to_string();
    std::fs::write(&p, one).unwrap();
    let e = read_solutions(&p, None).unwrap_err().to_string();
    assert!(e.contains(":1:") && e.contains("labels[1]"), "{e}");
}

/// Every format's labels are checked for their domain: OmegaPRM's `mc_value` is a Monte Carlo
/// estimate, so a value outside [0, 1] is an error naming the entry, in the flat and tree forms.
#[test]
fn omegaprm_values_outside_zero_one_are_refused() {
    let flat = serde_json::json!({"question": "q", "final_answer": "1",
        "reasoning_steps": [{"solution_prefix": "q a", "mc_value": 0.5}, {"solution_prefix": "q a b", "mc_value": 1.7}]});
    let e = Format::OmegaPrm.read(&flat, 0).unwrap_err().to_string();
    assert!(
        e.contains("reasoning_steps[1]") && e.contains("[0, 1]") && e.contains("1.7"),
        "{e}"
    );
    let tree = serde_json::json!({"question": "q", "final_answer": "1",
        "reasoning_steps": {"text": "q", "mc_value": -0.1, "children": []}});
    let e = Format::OmegaPrmTree.read(&tree, 0).unwrap_err().to_string();
    assert!(e.contains("mc_value") && e.contains("-0.1"), "{e}");
}

/// PRMBench records (a few in its shape): each modified process read with its error steps bad
/// and every other step good, the rest kept, and written back as it was.
#[test]
fn prmbench_records_round_trip_with_their_error_steps() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/prmbench_sample.jsonl");
    let sols = assert_lossless(&path, Format::PrmBench);
    assert_eq!(sols.len(), 4);
    let circular = &sols[0];
    assert_eq!(circular.id, "circular_prm_test_p1_0");
    let good: Vec<bool> = circular
        .steps
        .iter()
        .map(|s| s.label.as_ref().unwrap().is_good())
        .collect();
    assert_eq!(
        good,
        vec![true, true, false, false, true],
        "error steps 3 and 4 (1-based)"
    );
    assert_eq!(circular.meta["classification"], "circular");
    assert_eq!(circular.first_error(), Some(2));
    // Detected from the first record.
    let detected = read_solutions(&path, None).unwrap();
    assert_eq!(detected.len(), 4);
    // A step number outside the process names the field.
    let dir_tmp = scratch("prmbench-bad");
    let dir = dir_tmp.path();
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        r#"{"idx": "x", "modified_question": "q", "modified_process": ["a", "b"], "error_steps": [3], "classification": "circular"}"#,
    )
    .unwrap();
    let err = read_solutions(&bad, None).unwrap_err().to_string();
    assert!(err.contains("error_steps[0]") && err.contains(":1"), "{err}");
}

/// HumanEval's 164 problems: read with the prompt as question, the canonical solution's lines
/// as steps and the task id as gold answer; written back exactly.
#[test]
fn humaneval_problems_round_trip_with_lines_as_steps() {
    let path = data("humaneval/HumanEval.jsonl");
    let sols = assert_lossless(&path, Format::HumanEval);
    assert_eq!(sols.len(), 164);
    let first = &sols[0];
    assert_eq!(first.id, "HumanEval/0");
    assert_eq!(first.gold_answer.as_deref(), Some("HumanEval/0"));
    assert!(first.question.contains("def has_close_elements"));
    assert_eq!(first.steps[0].text, "    for idx, elem in enumerate(numbers):");
    assert_eq!(first.steps.len(), 7, "blank lines are not steps");
    assert_eq!(read_solutions(&path, None).unwrap().len(), 164, "detected");
}

/// An ALFWorld trajectory as AgentInstruct publishes it (ShareGPT turns with `loss`), and a
/// tool-calling one in OpenAI's chat layout with step labels: both come back exactly.
#[test]
fn agent_trajectories_round_trip_in_both_chat_layouts() {
    let alfworld = json!({
        "conversations": [
            {"from": "human", "loss": false, "value": "Interact with a household to solve a task. Reply with Thought: and Action:."},
            {"from": "gpt", "loss": false, "value": "OK"},
            {"from": "human", "loss": false, "value": "You are in the middle of a room. Looking quickly around you, you see a cabinet 1 and a toilet 1.\nYour task is to: put some spraybottle on toilet."},
            {"from": "gpt", "loss": true, "value": "Thought: A spraybottle may be in a cabinet.\nAction: go to cabinet 1"},
            {"from": "human", "loss": false, "value": "Observation: On the cabinet 1, you see a spraybottle 2."},
            {"from": "gpt", "loss": true, "value": "Thought: Take it.\nAction: take spraybottle 2 from cabinet 1"},
            {"from": "human", "loss": false, "value": "Observation: You pick up the spraybottle 2 from the cabinet 1."},
            {"from": "gpt", "loss": true, "value": "Action: put spraybottle 2 in/on toilet 1"}
        ],
        "id": "alfworld_12"
    });
    let tools = json!({
        "messages": [
            {"role": "system", "content": "You are a web shopping agent."},
            {"role": "user", "content": "Buy a red mug under $10."},
            {"role": "assistant", "content": "Search first.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"red mug\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "[1] Red mug $8 [2] Blue mug $5"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "click", "arguments": "{\"item\": 2}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": "Blue mug, $5. [Buy]"},
            {"role": "assistant", "content": "That one is blue; going back."}
        ],
        "labels": [true, false, null],
        "correct": false,
        "id": "webshop-3"
    });
    let dir_tmp = scratch("trajectories");
    let dir = dir_tmp.path();
    for (v, format) in [(alfworld, Format::Conversations), (tools, Format::Messages)] {
        assert_eq!(Format::detect(&v), Some(format));
        let path = dir.join(format!("{format}.jsonl"));
        std::fs::write(&path, format!("{v}\n")).unwrap();
        let sols = assert_lossless(&path, format);
        assert!(sols[0].is_trajectory());
        let turns = sols[0].turn_strings();
        if format == Format::Messages {
            assert_eq!(sols[0].question, "Buy a red mug under $10.");
            assert_eq!(sols[0].steps.len(), 3);
            assert_eq!(sols[0].steps[1].text, "click({\"item\": 2})");
            assert_eq!(turns[1], "click({\"item\": 2})\nObservation: Blue mug, $5. [Buy]");
            assert_eq!(sols[0].first_error(), Some(1));
            assert_eq!(sols[0].steps[2].observation, None);
            assert_eq!(sols[0].correct, Some(false));
        } else {
            assert_eq!(sols[0].steps.len(), 4);
            assert_eq!(
                sols[0].steps[1].text,
                "Thought: A spraybottle may be in a cabinet.\nAction: go to cabinet 1"
            );
        }
        // An RLHFlow record is still RLHFlow's.
        let rlhflow = json!({"conversations": [{"role": "user", "content": "Q Step 1: x"}, {"role": "assistant", "content": "+"}]});
        assert_eq!(Format::detect(&rlhflow), Some(Format::Rlhflow));
    }
}

#[test]
fn trajectories_whose_turns_do_not_alternate_are_refused_naming_the_turn() {
    let dir_tmp = scratch("trajectories-bad");
    let dir = dir_tmp.path();
    let bad = [
        (
            json!({"messages": [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
            "messages[2]",
        ),
        (
            json!({"conversations": [{"from": "human", "value": "task"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "o"}, {"from": "human", "value": "o2"}]}),
            "conversations[3]",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": "a", "tool_calls": []}, {"role": "user", "content": "task"}]}),
            "messages[0]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "t"}, {"role": "robot", "content": "a"}]}),
            "messages[1].role",
        ),
    ];
    for (i, (v, field)) in bad.into_iter().enumerate() {
        let path = dir.join(format!("bad{i}.jsonl"));
        std::fs::write(&path, format!("{v}\n")).unwrap();
        let e = format!("{:#}", read_solutions(&path, None).unwrap_err());
        assert!(e.contains(".jsonl:1:") && e.contains(field), "{e}");
    }
    // A solution with no observations between its steps is not a trajectory to write.
    let plain = Solution {
        id: "s".into(),
        question: "q".into(),
        steps: vec![stepwise_core::Step::new("a"), stepwise_core::Step::new("b")],
        ..Default::default()
    };
    let e = write_solutions(dir.join("plain.jsonl"), Format::Messages, &[plain]).unwrap_err();
    assert!(format!("{e:#}").contains("steps[0].observation"), "{e:#}");
}
