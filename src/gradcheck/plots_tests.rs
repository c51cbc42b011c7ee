//! Tests of `plots`: captions count what a log axis cannot show, nothing
//! loads from outside the page, decade ticks, histogram counts, thinning.

use super::*;

/// n values spread log-uniformly over `median` x 10^(+-decades), scrambled by `step` (an irrational).
fn spread(n: usize, median: f64, decades: f64, step: f64) -> Vec<f64> {
    (0..n).map(|i| median * 10f64.powf(decades * (2.0 * (i as f64 * step).fract() - 1.0))).collect()
}

/// One <figure> around one drawn <svg> with text in it; no raw '<', '>'
/// or '&' in text; no NaN or inf in an attribute.
fn assert_sound(html: &str) {
    assert!(html.starts_with("<figure>\n<svg ") && html.ends_with("</figure>\n") && html.matches("<svg").count() == 1, "{html}");
    assert!(html.contains("<text") && ["\"NaN", "NaN\"", "\"inf", "\"-inf", "inf\""].iter().all(|bad| !html.contains(bad)), "{html}");
    assert_eq!(html.matches('<').count(), html.matches('>').count(), "a raw '<' or '>' in text: {html}");
    for (i, _) in html.match_indices('&') {
        assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&#39;", "&apos;"].iter().any(|e| html[i..].starts_with(e)), "a raw '&' at {i}");
    }
}

fn series(name: &str, values: Vec<f64>) -> Series {
    Series { name: name.to_string(), values }
}

fn points(name: &str, points: Vec<(f64, f64)>) -> PointSeries {
    PointSeries { name: name.to_string(), points }
}

const PHI: f64 = 0.618_033_988_749_895;
const SQRT2_1: f64 = std::f64::consts::SQRT_2 - 1.0;

#[test]
fn values_that_cannot_be_placed_are_counted_in_the_caption() {
    let values = [vec![0.0, -0.0, 0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-3], spread(100, 1e-6, 2.0, PHI)].concat();
    let all = "3 exact zeros, 1 negative value, 1 NaN, 1 +inf, 1 -inf";
    let hist = histogram_svg("h", "x", &[series("fused", values.clone())], HistOptions::default());
    assert_sound(&hist);
    assert!(hist.contains(&format!("<figcaption>Not shown: {all}.</figcaption>")), "{hist}");
    assert_eq!(bin(&[series("fused", values.clone())], 40).1[0].iter().sum::<u64>(), 100);
    let named = histogram_svg("h", "x", &[series("fused", values.clone()), series("ref", vec![1.0, f64::NAN])], HistOptions::default());
    assert!(named.contains(&format!("Not shown: {all} in “fused”; 1 NaN in “ref”.")), "{named}");

    let with_bad_x = values.iter().map(|&v| (1.0, v)).chain([(f64::NAN, 1.0)]).collect();
    let scatter = scatter_svg("s", "x", "y", &[points("fused", with_bad_x)], ScatterOptions::default());
    assert_sound(&scatter);
    assert!(scatter.contains(&format!("Not shown: 8 points (x: 1 NaN; y: {all}).")), "{scatter}");
    let strip = strip_svg("s", "y", &[("at a kink".into(), values)], Default::default());
    assert_sound(&strip);
    assert!(strip.contains(&format!("Not shown: {all}.")) && strip.contains(">\nn=107\n<"), "{strip}");

    // The ends of the f64 range (a denormal, f64::MAX) draw, if not well, then without NaN, inf or a panic.
    let ends = vec![5e-324, f64::MAX];
    assert_sound(&histogram_svg("h", "x", &[series("ends", ends.clone())], HistOptions::default()));
    let corners = vec![(ends[0], ends[1]), (ends[1], ends[0])];
    assert_sound(&scatter_svg("s", "x", "y", &[points("ends", corners)], ScatterOptions::default()));
    assert_sound(&strip_svg("s", "y", &[("ends".into(), ends)], StripOptions::default()));
}

#[test]
fn histogram_counts_every_placeable_value_once() {
    let (edges, counts, excluded) = bin(&[series("a", vec![1.0, 1e4, 10.0, 100.0, 1e3, f64::NAN]), series("b", vec![3.0])], 4);
    assert_eq!((edges, counts, excluded[0].total()), (vec![0.0, 1.0, 2.0, 3.0, 4.0], vec![vec![1, 1, 1, 2], vec![1, 0, 0, 0]], 1));
    for bins in [1, 7, 40, 200] {
        let a = [spread(10_000, 3e-7, 3.0, PHI), vec![0.0, f64::NAN, -2.0, 5e-324, 1e300, f64::MIN_POSITIVE, f64::MAX]].concat();
        let (_, counts, excluded) = bin(&[series("a", a.clone())], bins);
        assert_eq!((counts[0].iter().sum::<u64>() as usize, excluded[0].total()), (a.len() - 3, 3), "bins={bins}");
        let (_, same, _) = bin(&[series("same", vec![2.5e-7; 1000])], bins);
        assert_eq!(same[0].iter().copied().filter(|&c| c > 0).collect::<Vec<_>>(), [1000], "a repeated value fills one bin");
    }
}

#[test]
fn ticks_are_decades() {
    let labels = |values: &[f64]| {
        let axis = Axis::over(values);
        axis.ticks.iter().map(|&t| axis.label(t)).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(labels(&[-8.3, -2.1]), "1e-9 1e-8 1e-7 1e-6 1e-5 1e-4 1e-3 1e-2");
    assert_eq!((labels(&[-7.5, -6.2]), Axis::over(&[-7.5, -6.2]).minor.len()), ("1e-8 1e-7 1e-6".into(), 16));
    assert_eq!(labels(&[-7.0]), "1e-8 1e-7 1e-6", "one value on a decade: the decades either side");
    assert_eq!(labels(&[-38.2, 1.5]), "1e-40 1e-35 1e-30 1e-25 1e-20 1e-15 1e-10 1e-5 1e0 1e5");
    assert_eq!(labels(&[0.0, 3.0]), "1 10 100 1000", "counts read as plain numbers");
}

#[test]
fn downsampling_bounds_the_count_and_keeps_what_matters() {
    let points: Vec<(f64, f64)> = spread(100_000, 1.0, 1.0, PHI).into_iter().zip(spread(100_000, 1e-6, 3.0, SQRT2_1)).collect();
    let kept = downsample(&points, 500);
    assert_eq!((kept.len(), &kept), (500, &downsample(&points, 500)), "not deterministic");
    let mut by_y = points.clone();
    by_y.sort_by(|a, b| a.1.total_cmp(&b.1));
    let by_x = |a: &&(f64, f64), b: &&(f64, f64)| a.0.total_cmp(&b.0);
    let extremes = [*points.iter().min_by(by_x).unwrap(), *points.iter().max_by(by_x).unwrap(), by_y[0]];
    for p in extremes.iter().chain(&by_y[by_y.len() - 50..]) {
        assert!(kept.contains(p), "{p:?} (an extreme or one of the 50 largest y) thinned away");
    }
    let mut at = points.iter();
    assert!(kept.iter().all(|k| at.any(|p| p == k)), "input order not kept");
    assert_eq!([0, 1, 3, 4, 5, 17].map(|max| downsample(&points, max).len()), [0, 1, 3, 4, 5, 17]);
    assert_eq!(five_numbers(&[1.0, 2.0]), Some([1.0, 1.25, 1.5, 1.75, 2.0]));
    assert_eq!((five_numbers(&[]), five_numbers(&[-1e308, 1e308]).unwrap()[2]), (None, 0.0));
}

#[test]
fn empty_inputs_draw_an_empty_plot_and_a_million_values_a_small_one() {
    let empty = [
        histogram_svg("h", "x", &[], HistOptions::default()),
        histogram_svg("h", "x", &[series("nan", vec![f64::NAN; 4])], Default::default()),
        scatter_svg("s", "x", "y", &[PointSeries::default()], Default::default()),
        strip_svg("s", "y", &[], StripOptions::default()),
        strip_svg("s", "y", &[("empty".into(), vec![]), ("zero".into(), vec![0.0])], Default::default()),
    ];
    empty.iter().for_each(|html| assert_sound(html));
    assert!(empty[0].contains("no values to show") && empty[1].contains("Not shown: 4 NaN.") && empty[2].contains("no points to show"));
    assert!(empty[4].contains("no tokens") && empty[4].contains(">\nn=0\n<") && empty[4].contains("none shown"));

    // The size of a plot does not grow with the data: bins, and thinned points.
    let errors = spread(1_000_000, 1e-7, 2.0, PHI);
    let hist = histogram_svg("h", "x", &[series("a", errors.clone())], Default::default());
    let scatter = scatter_svg("s", "x", "y", &[points("a", errors.iter().map(|&e| (1.0 + e, e)).collect())], Default::default());
    let strip = strip_svg("s", "y", &[("all".into(), errors)], Default::default());
    assert_eq!((hist.len() < 20_000, scatter.matches("<circle").count(), strip.matches("<circle").count()), (true, 2000, 200));
    assert!(scatter.contains("“a”: 2,000 of 1,000,000") && scatter.len() < 250_000, "{} bytes", scatter.len());
}

#[test]
fn pages_escape_their_text_and_load_nothing_from_outside() {
    assert_eq!(html_escape(r#"<a href="x">&'"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    let table =
        html_table(&["impl", "err <max>"], &[vec!["fused & co".into(), "1.5e-7".into()], vec!["<script>".into(), "n/a".into()]]);
    assert!(table.contains("<th>err &lt;max&gt;</th>") && table.contains("<td>fused &amp; co</td><td class=\"num\">1.5e-7</td>"));
    assert!(table.contains("<td>&lt;script&gt;</td><td>n/a</td>") && table.matches("<tr>").count() == 3);

    let (title, errors) = (r#"errors of <fused> & "ref""#, spread(2000, 1e-7, 2.0, PHI));
    let groups: Vec<(String, Vec<f64>)> =
        ["r inside the band, A<0 & clipped", "at a kink, A=0"].map(|g| (g.into(), errors.clone())).into();
    let plots = [
        histogram_svg(title, "|error| <x>", &[series("a<b", errors.clone()), series("c&d", vec![0.0])], Default::default()),
        strip_svg(title, "relative row error", &groups, StripOptions { width: 900, ..Default::default() }),
        scatter_svg(
            title,
            "token <i>",
            "err & bound's",
            &[points("p\"q", errors.iter().map(|&e| (e.sqrt(), e)).collect())],
            Default::default(),
        ),
    ];
    for html in &plots {
        assert_sound(html);
        assert!(html.contains("errors of &lt;fused&gt; &amp; &quot;ref&quot;") && !html.contains("<fused>"), "{html}");
    }
    assert!(plots[0].contains("a&lt;b") && plots[0].contains("“c&amp;d”") && plots[0].contains("|error| &lt;x&gt;"));
    assert!(plots[1].contains("A&lt;0 &amp;") && plots[2].contains("p&quot;q") && plots[2].contains("err &amp; bound&apos;s"));

    let sections = plots.map(|html| Section { heading: "plot <&>".into(), html });
    let page = html_page("gradcheck <run>", &sections);
    assert!(
        page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n") && page.contains("<title>gradcheck &lt;run&gt;</title>")
    );
    assert!(
        page.contains("<h2>plot &lt;&amp;&gt;</h2>")
            && page.contains("href=\"#section-3\"")
            && !html_page("one", &sections[..1]).contains("<nav>")
    );
    for needle in ["<script", "<link", "@import", "url(", "src=", "href=\"http", "<image", "@font-face"] {
        assert!(!page.contains(needle), "the page holds {needle:?}");
    }
    if let Some(path) = std::env::var_os("GRPO_PLOTS_SAMPLE") {
        std::fs::write(path, page).unwrap(); // a page to look at
    }
}
