//! The self-contained HTML report of `gradcheck` (plots from `plots`):
//! the per-token |logp error| distribution, the gradient-row error by clip
//! region and advantage sign, and the error against the logit scale.

use crate::evaluate::Outcome;
use crate::gradcheck::fixture::Fixture;
use crate::gradcheck::cases::FixtureCases;
use crate::gradcheck::run::{quantiles, ImplGradcheck};
use crate::gradcheck::plots::{html_escape, html_page, html_table, histogram_svg, scatter_svg, strip_svg, HistOptions, PointSeries, ScatterOptions, Section, Series, StripOptions};

/// The regions in the order the strip plot shows them.
const PLACES: [&str; 4] = ["r inside the band", "r below the band", "r above the band", "at a kink"];
const SIGNS: [&str; 3] = ["A>0", "A<0", "A=0"];

/// The self-contained report.html: the tables, then the plots.
pub fn page(fixture: &Fixture, cases: &FixtureCases, results: &[ImplGradcheck], command: &str) -> String {
    let case = &cases.fused;
    let valid = case.mask.iter().filter(|&&m| m != 0.0).count();
    let mut sections = vec![Section {
        heading: "Fixture and verdicts".into(),
        html: format!(
            "<p>{} fixture <code>{}</code> (model: {}): B={} T={} (of {}) H={} V={}, {valid} valid tokens. \
             Logits temperature mode, tau={}, token-mean, clip band [{}, {}], old_logp = the sampler's log-probs plus noise \
             (so every clip region is populated).</p><pre>{}</pre>{}\
             <p>The verdict is docs/spec.md's tolerance rule on every quantity (docs/tolerance.md); the plots below are per-token diagnostics.</p>",
            if fixture.synthetic { "Synthetic" } else { "Model" },
            html_escape(&fixture.dir.display().to_string()),
            html_escape(fixture.manifest["model"]["name"].as_str().unwrap_or("?")),
            case.shape.batch,
            cases.time,
            fixture.time,
            fixture.hidden_dim,
            fixture.vocab,
            case.hparams.temperature as f32,
            1.0 - case.hparams.eps_low,
            1.0 + case.hparams.eps_high,
            html_escape(command),
            verdict_table(results),
        ),
    }];
    let logp: Vec<Series> = results
        .iter()
        .filter(|r| r.tokens.iter().any(|t| t.logp_error.is_some()))
        .map(|r| Series { name: r.implementation.clone(), values: r.tokens.iter().filter_map(|t| t.logp_error).collect() })
        .collect();
    sections.push(Section {
        heading: "Per-token |logp error|".into(),
        html: histogram_svg(
            "|logp_impl - logp_oracle| per valid token",
            "|logp error| (nats)",
            &logp,
            HistOptions::default(),
        ),
    });
    for r in results.iter().filter(|r| !r.tokens.is_empty()) {
        let groups: Vec<(String, Vec<f64>)> = PLACES
            .iter()
            .flat_map(|place| SIGNS.iter().map(move |sign| format!("{place}, {sign}")))
            .map(|label| {
                let values = r.tokens.iter().filter(|t| t.region == label).map(|t| t.grad_row_error).collect::<Vec<_>>();
                (label, values)
            })
            .filter(|(label, values)| !values.is_empty() || !label.ends_with("A=0"))
            .collect();
        sections.push(Section {
            heading: format!("{}: gradient error by clip region and advantage sign", r.implementation),
            html: strip_svg(
                &format!("{}: max |grad error| of each token's row / the row's max |grad|", r.implementation),
                "relative row error",
                &groups,
                StripOptions { width: 900, ..StripOptions::default() },
            ),
        });
    }
    let scatter: Vec<PointSeries> = results
        .iter()
        .map(|r| PointSeries {
            name: r.implementation.clone(),
            points: r.tokens.iter().map(|t| (t.logit_scale, t.grad_row_error)).collect(),
        })
        .collect();
    sections.push(Section {
        heading: "Error against logit scale".into(),
        html: scatter_svg(
            "gradient row error against the row's max |logit|",
            "max |z| of the row",
            "relative row error",
            &scatter,
            ScatterOptions::default(),
        ),
    });
    sections.push(Section {
        heading: "Reproduce".into(),
        html: format!("<pre>{}</pre><p>report.json has every token's figures and every verdict.</p>", html_escape(command)),
    });
    html_page(&format!("gradcheck: {}", fixture.name()), &sections)
}

fn verdict_table(results: &[ImplGradcheck]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut logp: Vec<f64> = r.tokens.iter().filter_map(|t| t.logp_error).collect();
            let mut grad: Vec<f64> = r.tokens.iter().map(|t| t.grad_row_error).collect();
            let (l50, _, lmax) = quantiles(&mut logp);
            let (g50, _, gmax) = quantiles(&mut grad);
            vec![
                r.implementation.clone(),
                r.kind.clone(),
                match r.result.outcome {
                    Outcome::Pass => "PASS".into(),
                    Outcome::Fail => format!("FAIL: {}", r.result.reason),
                    Outcome::Unsupported => format!("unsupported: {}", r.result.reason),
                },
                format!("{l50:.2e} / {lmax:.2e}"),
                format!("{g50:.2e} / {gmax:.2e}"),
                format!("{:.1}", r.seconds),
            ]
        })
        .collect();
    html_table(&["implementation", "kind", "verdict", "logp error median / max", "grad row error median / max", "seconds"], &rows)
}
