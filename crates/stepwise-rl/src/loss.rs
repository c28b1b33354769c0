//! The policy-gradient loss: PPO's clipped ratio against the sampling policy, times each
//! token's advantage, plus GRPO's k3 estimate of the KL divergence to a frozen reference
//! (none for a sequence without reference log-probabilities: a run without a reference),
//! averaged over the learned tokens of a minibatch. Built from differentiable ops only (no
//! fused kernel without a backward pass), so every weight that shapes a token's probability
//! gets a gradient.

use crate::rollout::Sequence;
use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use stepwise_model::log_ratio::token_logprobs;
use stepwise_model::model::pad_batch;
use stepwise_model::Model;

/// What a minibatch's loss saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// Mean k3 KL estimate to the reference over learned tokens.
    pub kl: f64,
    /// Fraction of learned tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Learned tokens.
    pub tokens: usize,
}

/// Whether old (or reference) log-probabilities cover `s`'s tokens, or are absent (on-policy,
/// or no reference: the current ones stand in).
fn covers(old: &[f32], s: &Sequence) -> bool {
    old.is_empty() || old.len() == s.ids.len()
}

/// The loss of `batch` under `model` (in training mode for a gradient): `clip` is PPO's ε,
/// `kl_coef` the weight of the KL penalty.
pub(crate) fn rl_loss(model: &Model, batch: &[&Sequence], clip: f32, kl_coef: f32) -> Result<(Tensor, LossStats)> {
    ensure!(!batch.is_empty(), "an empty minibatch");
    let seqs: Vec<&[u32]> = batch.iter().map(|s| s.ids.as_slice()).collect();
    let (ids, mask, t) = pad_batch(&seqs, &model.device)?;
    let logp = token_logprobs(model, &ids, mask.as_ref())?;
    loss_of_logprobs(&logp, batch, t, clip, kl_coef)
}

/// [`rl_loss`] of the token log-probabilities `logp` of `batch` padded to `t` positions
/// (`[batch · t]`, differentiable).
pub(crate) fn loss_of_logprobs(
    logp: &Tensor,
    batch: &[&Sequence],
    t: usize,
    clip: f32,
    kl_coef: f32,
) -> Result<(Tensor, LossStats)> {
    let dev = logp.device();
    // Per position of the padded batch: learned or not, advantage, old and reference log-probs.
    // Positions not learned take the current log-probabilities (ratio 1, KL 0), so a padding
    // token's tiny probability cannot overflow the exponentials there.
    let n = batch.len() * t;
    let now: Vec<f32> = logp.to_vec1()?;
    let (mut learn, mut adv, mut old, mut reference) = (vec![0f32; n], vec![0f32; n], now.clone(), now);
    for (b, s) in batch.iter().enumerate() {
        ensure!(
            s.advantages.len() == s.ids.len() && covers(&s.old_logprobs, s) && covers(&s.ref_logprobs, s),
            "a sequence's advantages and log-probabilities must cover its tokens"
        );
        for i in (s.learn_from..s.ids.len()).filter(|&i| s.learns(i)) {
            let k = b * t + i;
            learn[k] = 1.0;
            adv[k] = s.advantages[i];
            // On-policy (no old log-probabilities): the current ones, held constant.
            old[k] = s.old_logprobs.get(i).copied().unwrap_or(old[k]);
            // No reference: the current log-probabilities, so k3 and its gradient are 0.
            reference[k] = s.ref_logprobs.get(i).copied().unwrap_or(reference[k]);
        }
    }
    let tensor = |v: &[f32]| Tensor::new(v, dev);
    let ratio = (logp - tensor(&old)?)?.exp()?;
    // min(ratio·A, clip(ratio)·A): where the clipped term is smaller it is a constant (no
    // gradient); elsewhere the unclipped term is the loss.
    let ratio_v: Vec<f32> = ratio.to_vec1()?;
    let mut unclipped_wins = vec![0f32; n];
    let mut clipped_value = vec![0f32; n];
    let mut clipped = 0usize;
    for k in 0..n {
        if learn[k] == 0.0 {
            continue;
        }
        let r = ratio_v[k];
        let c = r.clamp(1.0 - clip, 1.0 + clip);
        if r * adv[k] <= c * adv[k] {
            unclipped_wins[k] = 1.0;
        } else {
            clipped_value[k] = c * adv[k];
        }
        clipped += usize::from(c != r);
    }
    let pg = ((ratio * tensor(&adv)?)? * tensor(&unclipped_wins)?)?;
    let pg = (pg + tensor(&clipped_value)?)?.neg()?;
    // k3 = exp(ref − logp) − (ref − logp) − 1 ≥ 0, an unbiased estimate of KL(π‖π_ref).
    let d = (tensor(&reference)? - logp)?;
    let k3 = ((d.exp()? - &d)? - 1.0)?;
    let per_token = (pg + (k3.clone() * kl_coef as f64)?)?;
    let learn_t = tensor(&learn)?;
    let tokens = learn.iter().filter(|&&x| x > 0.0).count().max(1);
    let loss = ((per_token * &learn_t)?.sum_all()? / tokens as f64)?;
    let kl = ((k3 * &learn_t)?.sum_all()?.to_scalar::<f32>()? as f64) / tokens as f64;
    Ok((
        loss,
        LossStats {
            kl,
            clip_fraction: clipped as f64 / tokens as f64,
            tokens,
        },
    ))
}

/// `rl_loss` computed on the host from the learned tokens' log-probabilities `logp` (each
/// sequence's positions `learn_from..`, one after another, its `skip` ranges included: they
/// get no loss and a zero derivative), for a trainer that takes a loss's
/// derivative by each token's log-probability (the packed engine's): the loss, that derivative,
/// and what the loss saw.
pub fn policy_loss(logp: &[f32], batch: &[&Sequence], clip: f32, kl_coef: f32) -> Result<(f32, Vec<f32>, LossStats)> {
    let tokens: usize = batch
        .iter()
        .map(|s| (s.learn_from..s.ids.len()).filter(|&i| s.learns(i)).count())
        .sum();
    ensure!(tokens > 0, "a minibatch without learned tokens");
    let n = tokens as f32;
    let (mut loss, mut kl, mut clipped) = (0.0f64, 0.0f64, 0usize);
    let mut coef = Vec::with_capacity(logp.len());
    let mut now = logp.iter();
    for s in batch {
        ensure!(
            s.learn_from >= 1
                && s.advantages.len() == s.ids.len()
                && covers(&s.old_logprobs, s)
                && covers(&s.ref_logprobs, s),
            "a sequence's advantages and log-probabilities must cover its tokens, after a prompt"
        );
        for i in s.learn_from..s.ids.len() {
            let l = *now.next().context("fewer log-probabilities than learned tokens")?;
            if !s.learns(i) {
                coef.push(0.0);
                continue;
            }
            let old = s.old_logprobs.get(i).copied().unwrap_or(l);
            let (a, ratio) = (s.advantages[i], (l - old).exp());
            let c = ratio.clamp(1.0 - clip, 1.0 + clip);
            // min(ratio·A, clip(ratio)·A): the clipped term is a constant where it is smaller.
            let (pg, d_pg) = if ratio * a <= c * a {
                (-ratio * a, -ratio * a)
            } else {
                (-c * a, 0.0)
            };
            clipped += usize::from(c != ratio);
            // k3 = exp(ref − logp) − (ref − logp) − 1, and d k3 / d logp = 1 − exp(ref − logp).
            let d = s.ref_logprobs.get(i).map_or(0.0, |&r| r - l);
            let k3 = d.exp() - d - 1.0;
            loss += (pg + kl_coef * k3) as f64;
            kl += k3 as f64;
            coef.push((d_pg + kl_coef * (1.0 - d.exp())) / n);
        }
    }
    ensure!(now.next().is_none(), "more log-probabilities than learned tokens");
    Ok((
        (loss / tokens as f64) as f32,
        coef,
        LossStats {
            kl: kl / tokens as f64,
            clip_fraction: clipped as f64 / tokens as f64,
            tokens,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candle's loss of `batch` padded to `t` positions at log-probabilities `values`
    /// (`[batch · t]`, PPO's ε 0.2, KL weight 0.1): its value, what it saw, its gradient.
    fn candle_loss(values: &[f32], batch: &[&Sequence], t: usize) -> (f32, LossStats, Vec<f32>) {
        let logp = candle_core::Var::from_vec(values.to_vec(), values.len(), &candle_core::Device::Cpu).unwrap();
        let (loss, stats) = loss_of_logprobs(logp.as_tensor(), batch, t, 0.2, 0.1).unwrap();
        let grads = loss.backward().unwrap();
        let grad = grads.get(logp.as_tensor()).unwrap().to_vec1().unwrap();
        (loss.to_scalar().unwrap(), stats, grad)
    }

    /// The host's policy loss (what the packed trainer takes) is candle's `rl_loss` of the same
    /// log-probabilities, and its derivative is candle's gradient, clipped tokens included; a
    /// skipped range (an observation the policy read) gets neither loss nor gradient.
    #[test]
    fn the_host_policy_loss_is_the_rl_loss_and_its_gradient() {
        let seqs: Vec<Sequence> = [(6usize, 2usize, 0.0f32, vec![(4, 5)]), (5, 3, 0.7, vec![])]
            .iter()
            .map(|(len, learn_from, shift, skip)| (*len, *learn_from, *shift, skip.clone()))
            .map(|(len, learn_from, shift, skip)| Sequence {
                ids: (0..len as u32).map(|i| 3 + i % 4).collect(),
                learn_from,
                skip,
                advantages: (0..len).map(|i| [1.0, -0.5, 2.0, -1.5][i % 4]).collect(),
                // Ratios from e^-0.6 to e^0.6: some inside PPO's range, some clipped either side.
                old_logprobs: (0..len).map(|i| -1.0 - 0.3 * i as f32 + shift).collect(),
                ref_logprobs: (0..len).map(|i| -1.2 - 0.1 * i as f32).collect(),
            })
            .collect();
        let batch: Vec<&Sequence> = seqs.iter().collect();
        let t = 6;
        let values: Vec<f32> = (0..2 * t)
            .map(|k| -1.0 - 0.3 * (k % t) as f32 + 0.6 * ((k * 7 % 5) as f32 / 4.0 - 0.5))
            .collect();
        let (loss, stats, grad) = candle_loss(&values, &batch, t);
        let learned: Vec<f32> = seqs
            .iter()
            .enumerate()
            .flat_map(|(b, s)| (s.learn_from..s.ids.len()).map(move |i| b * t + i))
            .map(|k| values[k])
            .collect();
        let (value, derivative, host) = policy_loss(&learned, &batch, 0.2, 0.1).unwrap();
        assert!((value - loss).abs() < 1e-5);
        assert_eq!((host.tokens, host.clip_fraction), (stats.tokens, stats.clip_fraction));
        assert!(host.clip_fraction > 0.0 && host.clip_fraction < 1.0, "{host:?}");
        assert!((host.kl - stats.kl).abs() < 1e-6);
        assert_eq!(host.tokens, 3 + 2, "the skipped range is not counted");
        let mut k = 0;
        for (b, s) in seqs.iter().enumerate() {
            for (i, &g) in grad[b * t..(b + 1) * t].iter().enumerate() {
                if (s.learn_from..s.ids.len()).contains(&i) {
                    assert!(
                        (derivative[k] - g).abs() < 1e-6,
                        "token {b}/{i}: {} vs {g}",
                        derivative[k]
                    );
                    k += 1;
                }
                if !s.learns(i) {
                    assert_eq!(g, 0.0, "token {b}/{i} is not learned");
                }
            }
        }
    }

    /// Without old log-probabilities (an on-policy update) both losses hold the current ones
    /// constant: the loss and derivative of old log-probabilities equal to the current ones,
    /// nothing clipped.
    #[test]
    fn without_old_log_probabilities_the_ratio_is_one() {
        let make = |old: Vec<f32>| Sequence {
            ids: vec![3, 4, 5, 6, 7],
            learn_from: 2,
            advantages: vec![0.0, 0.0, 1.0, -0.5, 2.0],
            old_logprobs: old,
            ref_logprobs: vec![0.0, 0.0, -1.1, -0.9, -2.0],
            ..Default::default()
        };
        let now = [-1.3f32, -0.7, -2.4];
        let mut padded = vec![0.0, 0.0];
        padded.extend(now);
        let (explicit, absent) = (make(padded.clone()), make(Vec::new()));
        let (a, da, sa) = policy_loss(&now, &[&explicit], 0.2, 0.1).unwrap();
        let (b, db, sb) = policy_loss(&now, &[&absent], 0.2, 0.1).unwrap();
        assert_eq!((a, da, sa), (b, db, sb));
        assert_eq!(sb.clip_fraction, 0.0);
        let (with_old, _, with_old_grad) = candle_loss(&padded, &[&explicit], 5);
        let (without, _, without_grad) = candle_loss(&padded, &[&absent], 5);
        assert_eq!((with_old, with_old_grad), (without, without_grad));
        // Old log-probabilities of the wrong length are still refused.
        let short = make(vec![0.0; 3]);
        assert!(policy_loss(&now, &[&short], 0.2, 0.1).is_err());
    }
}
