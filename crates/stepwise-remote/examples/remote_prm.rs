//! stepwise-remote's main use: a PRM behind a server as a `StepScorer`, so that search, best-of-N
//! and annotation use it as they use a local one. Start a server first, for example
//! `stepwise serve --model POLICY --prm PRM --port 8000`, then:
//!
//! cargo run -p stepwise-remote --example remote_prm -- http://127.0.0.1:8000 PRM_NAME
//!
//! (the PRM's name is its folder's name, as the server's `/v1/models` lists it)

use stepwise_core::seams::{ScoreInput, StepScorer};
use stepwise_remote::{Client, Protocol, RemoteScorer, ServerConfig};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name] = args.as_slice() else {
        eprintln!("usage: remote_prm URL[,URL...] PRM_NAME   (a `stepwise serve --prm` server)");
        return Ok(());
    };
    // Several comma-separated servers share the load; failed requests are retried on another.
    let urls = url.split(',').map(str::to_string).collect();
    let client = Client::new(ServerConfig::new(urls, name))?;
    let scorer = RemoteScorer {
        client: &client,
        protocol: Protocol::Stepwise,
    };
    let input = ScoreInput {
        problem_id: "p1",
        question: "Ann has 3 bags of 4 apples. How many apples does she have?",
        steps: vec!["3 * 4 = 12", "The answer is 12."],
        partial: false,
    };
    let scored = scorer.score(&[input])?;
    println!("step scores from {url}: {:?}", scored.scores[0]);
    Ok(())
}
