//! A studio on two records, labelled by a script through the HTTP API the page uses, and the
//! labels exported as PRM800K lines.
use stepwise_core::formats::Format;
use stepwise_core::record::{Solution, Step};
use stepwise_studio::client::Client;
use stepwise_studio::export::{export, to_jsonl, Shape};
use stepwise_studio::{NewRecord, Role, Settings, Store};

fn main() -> anyhow::Result<()> {
    let db = std::env::temp_dir().join(format!("stepwise-studio-example-{}.sqlite", std::process::id()));
    let mut store = Store::open(&db)?;
    let settings = Settings {
        stop_at_first_bad: true,
        qc_every: 0,
        ..Default::default()
    };
    let project = store.project_or_create("demo", &settings, 1)?;
    let solution = |id: &str, steps: &[&str]| Solution {
        id: id.into(),
        question: "What is 2 + 3 * 4?".into(),
        gold_answer: Some("14".into()),
        steps: steps.iter().map(|s| Step::new(*s)).collect(),
        ..Default::default()
    };
    let records = vec![
        solution("right", &["3 * 4 = 12", "2 + 12 = 14"]),
        solution("wrong", &["2 + 3 = 5", "5 * 4 = 20"]),
    ];
    store.add_records(&project, NewRecord::each(records, false))?;
    store.set_user("script", Role::Labeller, "a long password")?;

    // Serve it, and label as a person would: the first step that is wrong gets −1.
    let running = stepwise_studio::server::spawn(Store::open(&db)?, "127.0.0.1:0")?;
    let me = Client::login(&running.url(), "script", "a long password")?;
    while let Some(id) = me.next("demo")? {
        let record = me.record(id)?;
        let wrong = record.steps.iter().position(|s| s.text.starts_with("2 + 3"));
        for (i, _) in record
            .steps
            .iter()
            .enumerate()
            .take(wrong.map_or(usize::MAX, |w| w + 1))
        {
            me.rate(id, i, Some(if Some(i) == wrong { -1 } else { 1 }), None)?;
        }
        me.finish(id, if wrong.is_some() { "found_error" } else { "solution" })?;
    }
    drop(running);

    let labelled = export(&Store::open(&db)?, &project, Shape::PerLabelling, false)?;
    print!("{}", to_jsonl(&labelled, Format::Prm800k)?);
    Ok(())
}
