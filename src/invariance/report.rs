//! What `invariance` prints and writes: one line per implementation,
//! report.md's table per implementation and property, and report.json.

use std::fmt::Write as _;

use super::{ImplInvariance, InvarianceOptions};

/// How far an on-policy ratio moves from 1 at a logp difference `d`, against the clip edges.
pub fn consequence(d: f64) -> String {
    if d == 0.0 {
        return "on-policy ratios exactly 1".into();
    }
    let r = d.exp_m1();
    let edge = |eps: f64| if r >= eps { "reached" } else { "not reached" };
    format!(
        "on-policy ratios off 1 by up to {r:.2e}: eps 0.2 {}, 0.28 {}, GSPO's 3e-4 {} ({:.1e} of it)",
        edge(0.2),
        edge(0.28),
        edge(3e-4),
        r / 3e-4
    )
}

pub(super) fn summary_line(r: &ImplInvariance, max_ulps: u64) -> String {
    let mut s = format!("{} {}:", if r.variant.is_some() { "VARIANT" } else if r.refused.is_some() { "UNMEASURED" } else { "INVARIANT" }, r.implementation);
    for (p, m) in &r.measures {
        let verdict = match m.cases {
            0 => "not measured".into(),
            _ if m.max_ulps == 0 => m.verdict(max_ulps),
            _ => format!("{} (logp {} ulps)", m.verdict(max_ulps), m.logp_ulps),
        };
        let _ = write!(s, " {} {verdict};", p.name());
    }
    if let (Some(p), Some(case), Some(replay)) = (r.variant, &r.minimal_case, &r.replay) {
        let _ = write!(s, "\n     variant under {}; minimal case: {case}\n     replay: {replay}", p.name());
    }
    if let Some(why) = &r.refused {
        let _ = write!(s, "\n     not measured: {why}");
    }
    s
}

pub(super) fn report_md(results: &[ImplInvariance], opts: &InvarianceOptions) -> String {
    let mut w = String::new();
    let _ = writeln!(w, "# grpo-verify invariance\n");
    let _ = writeln!(
        w,
        "{} cases per implementation (seed {}, dtypes {}), B >= 2, the loss summed over a constant. A property holds \
         within --max-ulps {}; ulps are of the dtype each output came back in.\n",
        opts.cases,
        opts.seed,
        opts.bounds.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "),
        opts.max_ulps
    );
    for r in results {
        let _ = writeln!(w, "## `{}` ({} kind, {:.0} s)\n", r.implementation, r.kind.name(), r.seconds);
        let _ = writeln!(w, "| property | variant | verdict | where | logp alone | max \\|logp difference\\| | consequence | cases |");
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
        for (p, m) in &r.measures {
            let sums = m.sums_ulps.map_or(String::new(), |u| format!(" (summed loss and d lm_head: {u} ulps)"));
            let _ = writeln!(
                w,
                "| {} | {} | {}{sums} | {} | {} ulps | {:.3e} | {} | {} |",
                p.name(),
                p.says(),
                if m.cases == 0 { "not measured".into() } else { m.verdict(opts.max_ulps) },
                m.at,
                m.logp_ulps,
                m.max_logp_diff,
                consequence(m.max_logp_diff),
                m.cases
            );
        }
        if let (Some(p), Some(case), Some(replay)) = (r.variant, &r.minimal_case, &r.replay) {
            let _ = writeln!(w, "\nVariant under `{}`; minimal case: {case}. Replay: `{replay}`", p.name());
        }
        if let Some(why) = &r.refused {
            let _ = writeln!(w, "\nNot measured: {why}");
        }
        let _ = writeln!(w);
    }
    w
}

/// report.json: the run (its partition among them, for `merge`) and each
/// implementation's result.
pub(super) fn report_json(results: &[ImplInvariance], opts: &InvarianceOptions) -> serde_json::Value {
    serde_json::json!({
        "tool": format!("grpo-verify {}", env!("CARGO_PKG_VERSION")),
        "report": "invariance",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "partition": opts.partition,
        "seed": opts.seed,
        "cases": opts.cases,
        "max_ulps": opts.max_ulps,
        "properties": opts.properties,
        "passed": results.iter().all(|r| r.variant.is_none() && r.refused.is_none()),
        "implementations": results,
    })
}
