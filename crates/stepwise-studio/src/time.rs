//! Wall-clock times as stored (Unix seconds) and as exported (PRM800K's ISO 8601).

/// Seconds since the Unix epoch, with sub-second precision.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `t` (Unix seconds, UTC) as PRM800K writes its timestamps: `2022-07-17T16:56:51.323252`.
pub fn iso8601(t: f64) -> String {
    let secs = t.floor() as i64;
    let micros = ((t - secs as f64) * 1e6).round().min(999_999.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn iso8601_matches_known_dates() {
        assert_eq!(super::iso8601(0.0), "1970-01-01T00:00:00.000000");
        assert_eq!(super::iso8601(1_658_077_011.323_252), "2022-07-17T16:56:51.323252");
        assert_eq!(super::iso8601(951_782_400.0), "2000-02-29T00:00:00.000000");
    }
}
