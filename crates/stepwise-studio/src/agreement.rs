//! Agreement between people rating the same steps: Cohen's κ for a pair, Fleiss' κ for any
//! number (items may have different numbers of ratings), and agreement on the first error.

use std::collections::{BTreeMap, HashMap};

/// The three PRM800K ratings as category indices.
fn category(r: i64) -> usize {
    (r.clamp(-1, 1) + 1) as usize
}

/// Cohen's κ of two raters over the items both rated: (κ, items). `None` with no shared item,
/// or when chance agreement is total (both always gave the one same rating).
pub fn cohen(a: &HashMap<(i64, usize), i64>, b: &HashMap<(i64, usize), i64>) -> Option<(f64, usize)> {
    let pairs: Vec<(usize, usize)> = a
        .iter()
        .filter_map(|(k, &x)| b.get(k).map(|&y| (category(x), category(y))))
        .collect();
    let n = pairs.len();
    if n == 0 {
        return None;
    }
    let (mut ma, mut mb, mut same) = ([0f64; 3], [0f64; 3], 0f64);
    for &(x, y) in &pairs {
        ma[x] += 1.0;
        mb[y] += 1.0;
        same += f64::from(u8::from(x == y));
    }
    let n = n as f64;
    let po = same / n;
    let pe: f64 = (0..3).map(|c| ma[c] / n * mb[c] / n).sum();
    (pe < 1.0).then(|| ((po - pe) / (1.0 - pe), pairs.len()))
}

/// Fleiss' κ over items with two or more ratings each (Fleiss 1971, with per-item rater
/// counts): (κ, items). `None` when no item has two ratings or chance agreement is total.
pub fn fleiss(items: &BTreeMap<(i64, usize), Vec<i64>>) -> Option<(f64, usize)> {
    let rated: Vec<[f64; 3]> = items
        .values()
        .filter(|v| v.len() >= 2)
        .map(|v| {
            let mut c = [0f64; 3];
            for &r in v {
                c[category(r)] += 1.0;
            }
            c
        })
        .collect();
    if rated.is_empty() {
        return None;
    }
    let (mut totals, mut all, mut p_bar) = ([0f64; 3], 0f64, 0f64);
    for c in &rated {
        let n: f64 = c.iter().sum();
        p_bar += c.iter().map(|x| x * (x - 1.0)).sum::<f64>() / (n * (n - 1.0));
        for j in 0..3 {
            totals[j] += c[j];
        }
        all += n;
    }
    p_bar /= rated.len() as f64;
    let pe: f64 = totals.iter().map(|t| (t / all).powi(2)).sum();
    (pe < 1.0).then(|| ((p_bar - pe) / (1.0 - pe), rated.len()))
}

/// The first step rated −1 in `ratings` (step → rating), or `None` for no error.
pub fn first_error(ratings: &BTreeMap<usize, i64>) -> Option<usize> {
    ratings.iter().find(|(_, &r)| r == -1).map(|(&i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cohen_is_one_for_identical_and_zero_for_chance() {
        let a: HashMap<_, _> = [((1, 0), 1), ((1, 1), -1), ((2, 0), 0), ((2, 1), 1)].into();
        assert_eq!(cohen(&a, &a).map(|k| k.0), Some(1.0));
        // Independent halves: p_o = 0.5, p_e = 0.5.
        let x: HashMap<_, _> = [((1, 0), 1), ((1, 1), 1), ((1, 2), -1), ((1, 3), -1)].into();
        let y: HashMap<_, _> = [((1, 0), 1), ((1, 1), -1), ((1, 2), 1), ((1, 3), -1)].into();
        let (k, n) = cohen(&x, &y).unwrap();
        assert!(k.abs() < 1e-12 && n == 4, "{k}");
    }

    #[test]
    fn fleiss_matches_a_hand_computed_case() {
        // Two items, three raters: [+1,+1,+1] and [+1,+1,-1].
        // P_1 = 1, P_2 = (2*1)/(3*2) = 1/3, P̄ = 2/3; p(+1) = 5/6, p(-1) = 1/6,
        // P_e = 26/36; κ = (2/3 - 26/36) / (1 - 26/36) = -0.2.
        let items: BTreeMap<_, _> = [((1, 0), vec![1, 1, 1]), ((1, 1), vec![1, 1, -1])].into();
        let (k, n) = fleiss(&items).unwrap();
        assert!((k + 0.2).abs() < 1e-12 && n == 2, "{k}");
    }
}
