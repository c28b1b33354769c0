//! What the RL tests share: a word-level tokenizer, a tiny policy, and a run killed in its third update resumes to an uninterrupted run's
//! weights and log.

use candle_core::Device;
use std::path::PathBuf;
use stepwise_model::train::VarMap;
use stepwise_model::{HeadKind, Model, ModelConfig, Tokenizer};
use stepwise_rl::prime::OnlinePrm;

/// A word-level tokenizer over `words` (`<unk>` and `<eos>` among them).
pub fn word_tokenizer(words: &[&str]) -> Tokenizer {
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    Tokenizer::word_level(&words, "<unk>", Some("<eos>")).unwrap()
}

/// A fresh tiny causal LM over `vocab` words.
pub fn tiny_policy(vocab: usize, seed: u64) -> (Model, VarMap) {
    let varmap = VarMap::new();
    let cfg = ModelConfig::tiny(vocab, 32, 1, 4, 2, HeadKind::CausalLm);
    let model = Model::fresh(cfg, &varmap, &Device::Cpu, seed).unwrap();
    (model, varmap)
}

/// One RL run into a folder, its second argument seeing each update.
pub type TrainInto<'a> = dyn Fn(&PathBuf, &dyn Fn(usize)) -> Vec<stepwise_rl::UpdateLog> + 'a;

/// `train` (one run into a folder, `on_update` seeing each update) whole, and again killed in
/// update 3 then resumed: the policy's weights (and the implicit PRM's, with `prime`) and the
/// logs are the same.
pub fn assert_killed_run_resumes(name: &str, prime: bool, train: &TrainInto) {
    let root_tmp = tempfile::tempdir().unwrap();
    let root = root_tmp.path().join(format!("stepwise-rl-resume-{name}"));
    let weights = |dir: &PathBuf| {
        let mut w = vec![std::fs::read(dir.join("model.safetensors")).unwrap()];
        if prime {
            w.push(std::fs::read(OnlinePrm::dir(dir).join("model.safetensors")).unwrap());
        }
        w
    };
    let whole = root.join("whole");
    let full_log = train(&whole, &|_| {});
    let cut = root.join("cut");
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        train(&cut, &|update| assert!(update < 3, "killed during update 3"))
    }));
    assert!(crashed.is_err(), "the run was to die in update 3");
    let resumed = train(&cut, &|_| {});
    assert!(
        weights(&whole) == weights(&cut),
        "resumed weights differ from the uninterrupted run's"
    );
    let summary = |log: &[stepwise_rl::UpdateLog]| {
        log.iter()
            .map(|l| (l.reward, l.sampled_tokens, l.implicit_prm.map(|p| p.loss)))
            .collect::<Vec<_>>()
    };
    assert_eq!(summary(&full_log), summary(&resumed));
    assert_eq!(resumed.iter().all(|l| l.implicit_prm.is_some()), prime);
    std::fs::remove_dir_all(&root).unwrap();
}
