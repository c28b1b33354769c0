//! The report's HTML: enough Markdown for it (headings, bullets, tables, images, bold,
//! paragraphs), so `report.html` opens in any browser with no converter installed.

use std::fmt::Write as _;

/// Enough Markdown for the report: headings, bullets, tables, images, bold, paragraphs.
pub fn markdown_to_html(md: &str) -> String {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let inline = |s: &str| {
        let mut out = String::new();
        for (i, part) in esc(s).split("**").enumerate() {
            out.push_str(if i % 2 == 1 { "<b>" } else { "" });
            out.push_str(part);
            out.push_str(if i % 2 == 1 { "</b>" } else { "" });
        }
        out.replace('`', "")
    };
    let mut h = String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>stepwise lab report</title><style>body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}img{max-width:100%}</style></head><body>\n");
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            if line.contains("---") {
                continue;
            }
            if !in_table {
                h.push_str("<table>\n");
                in_table = true;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            h.push_str("<tr>");
            for c in cells {
                let _ = write!(h, "<td>{}</td>", inline(c.trim()));
            }
            h.push_str("</tr>\n");
            continue;
        }
        if in_table {
            h.push_str("</table>\n");
            in_table = false;
        }
        if let Some(t) = line.strip_prefix("## ") {
            let _ = writeln!(h, "<h2>{}</h2>", inline(t));
        } else if let Some(t) = line.strip_prefix("# ") {
            let _ = writeln!(h, "<h1>{}</h1>", inline(t));
        } else if let Some(t) = line.strip_prefix("- ") {
            let _ = writeln!(h, "<li>{}</li>", inline(t));
        } else if let Some(t) = line.strip_prefix("![") {
            let (alt, rest) = t.split_once("](").unwrap_or((t, ""));
            let _ = writeln!(
                h,
                "<p><img alt=\"{}\" src=\"{}\"></p>",
                esc(alt),
                esc(rest.trim_end_matches(')'))
            );
        } else if !line.trim().is_empty() {
            let _ = writeln!(h, "<p>{}</p>", inline(line));
        }
    }
    if in_table {
        h.push_str("</table>\n");
    }
    h.push_str("</body></html>\n");
    h
}
