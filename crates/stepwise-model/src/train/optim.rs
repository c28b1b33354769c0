//! AdamW with decoupled weight decay, whose state can be saved and restored (so that an
//! interrupted training run resumes exactly), plus global-norm gradient clipping.

use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::collections::HashMap;
use std::path::Path;

/// AdamW over named variables.
pub struct AdamW {
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken.
    pub step: usize,
    /// Learning rate (set every step by the schedule).
    pub lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl AdamW {
    /// A new optimiser over `vars` (name, variable), sorted by name for a stable state layout.
    pub fn new(mut vars: Vec<(String, Var)>, lr: f64, weight_decay: f64) -> Result<Self> {
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        let m = vars.iter().map(|(_, v)| zeros(v)).collect::<candle_core::Result<_>>()?;
        let v = vars.iter().map(|(_, v)| zeros(v)).collect::<candle_core::Result<_>>()?;
        Ok(AdamW {
            vars,
            m,
            v,
            step: 0,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        })
    }

    /// The variables, in state order.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.vars.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Global L2 norm of the gradients.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut sq = 0.0f64;
        for (_, var) in &self.vars {
            if let Some(g) = grads.get(var.as_tensor()) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        Ok(sq.sqrt())
    }

    /// One update with gradients scaled by `scale` (for clipping and accumulation).
    pub fn step(&mut self, grads: &GradStore, scale: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t);
        let c2 = 1.0 - b2.powi(t);
        for (i, (_, var)) in self.vars.iter().enumerate() {
            let Some(g) = grads.get(var.as_tensor()) else { continue };
            let g = (g * scale)?;
            self.m[i] = ((&self.m[i] * b1)? + (&g * (1.0 - b1))?)?;
            self.v[i] = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let mhat = (&self.m[i] / c1)?;
            let vhat = (&self.v[i] / c2)?;
            let update = (mhat / (vhat.sqrt()? + self.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - self.lr * self.weight_decay))?;
            var.set(&(decayed - (update * self.lr)?)?)?;
        }
        Ok(())
    }

    /// Save the moments and step count.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = HashMap::new();
        for (i, (name, _)) in self.vars.iter().enumerate() {
            map.insert(format!("m.{name}"), self.m[i].clone());
            map.insert(format!("v.{name}"), self.v[i].clone());
        }
        map.insert("step".into(), Tensor::new(&[self.step as u32], self.m[0].device())?);
        let tmp = path.with_extension("tmp");
        candle_core::safetensors::save(&map, &tmp)?;
        std::fs::rename(tmp, path)?;
        Ok(())
    }

    /// Restore what [`AdamW::save`] wrote.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let dev = self.m[0].device().clone();
        let map = candle_core::safetensors::load(path, &dev)?;
        for (i, (name, _)) in self.vars.iter().enumerate() {
            if let (Some(m), Some(v)) = (map.get(&format!("m.{name}")), map.get(&format!("v.{name}"))) {
                self.m[i] = m.clone();
                self.v[i] = v.clone();
            }
        }
        if let Some(s) = map.get("step") {
            self.step = s.to_vec1::<u32>()?[0] as usize;
        }
        Ok(())
    }
}

/// Every variable of `varmap` with its name (what [`AdamW::new`] takes).
pub fn named_vars(varmap: &candle_nn::VarMap) -> Vec<(String, Var)> {
    varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sum `b` into `a` (gradient accumulation).
pub fn accumulate(a: &mut GradStore, b: GradStore, vars: &[Var]) -> Result<()> {
    for v in vars {
        let t = v.as_tensor();
        if let Some(g) = b.get(t) {
            let sum = match a.get(t) {
                Some(prev) => (prev + g)?,
                None => g.clone(),
            };
            a.insert(t, sum);
        }
    }
    Ok(())
}

/// Learning rate at `step`: linear warm-up then cosine decay to 10% of the peak.
pub fn schedule(step: usize, peak: f64, warmup: usize, total: usize) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / (total.saturating_sub(warmup)).max(1) as f64;
    let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos());
    peak * (0.1 + 0.9 * cos)
}
