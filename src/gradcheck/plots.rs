//! Plots for the `gradcheck` report: plotters' SVG backend, inlined in one
//! self-contained HTML page (no scripts, fonts or external references; it
//! opens offline). There is no font backend: text stays SVG `<text>`, its
//! width estimated from the number of characters.
//!
//! Every axis with values on it is a log axis: these are |errors|, their
//! relative size and the size of logits. No value is dropped silently: one a
//! log axis cannot place (a zero, a negative, NaN, an infinity) is counted
//! per series and named in the caption under the plot ("Not shown: 3 exact
//! zeros.").

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The Okabe–Ito palette, told apart under the common colour-vision
/// deficiencies. Its yellow is left out: it cannot be read on white.
pub const PALETTE: [&str; 7] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000"];

/// One named set of values, e.g. |error| of one implementation's gradient.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// Its values.
    pub values: Vec<f64>,
}

/// One named set of (x, y) points.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PointSeries {
    /// Its legend.
    pub name: String,
    /// Its (x, y) points.
    pub points: Vec<(f64, f64)>,
}

/// `bins` equal bins over log10 of the values (pass the plain values); counts
/// on a log axis, so a tail of 3 stays visible beside a peak of 10^6.
#[derive(Clone, Debug, PartialEq)]
pub struct HistOptions {
    /// Bins over log10 of the values.
    pub bins: usize,
    /// The SVG's width in pixels.
    pub width: u32,
    /// The SVG's height in pixels.
    pub height: u32,
}

impl Default for HistOptions {
    fn default() -> Self {
        HistOptions { bins: 40, width: 640, height: 360 }
    }
}

/// At most `max_points` per series are drawn (see `downsample`).
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterOptions {
    /// Points drawn per series at most.
    pub max_points: usize,
    /// The SVG's width in pixels.
    pub width: u32,
    /// The SVG's height in pixels.
    pub height: u32,
}

impl Default for ScatterOptions {
    fn default() -> Self {
        ScatterOptions { max_points: 2000, width: 640, height: 360 }
    }
}

/// At most `max_points` dots per group, at evenly spaced ranks (so always the min and the max).
#[derive(Clone, Debug, PartialEq)]
pub struct StripOptions {
    /// Dots drawn per group at most.
    pub max_points: usize,
    /// The SVG's width in pixels.
    pub width: u32,
    /// The SVG's height in pixels.
    pub height: u32,
}

impl Default for StripOptions {
    fn default() -> Self {
        StripOptions { max_points: 200, width: 640, height: 360 }
    }
}

/// One part of an HTML page: a heading (escaped here) over raw HTML.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Section {
    /// Its heading (plain text).
    pub heading: String,
    /// Its body, raw HTML.
    pub html: String,
}

/// Overlaid histograms of `series` over shared bins, one outline each; the
/// legend gives each series' number of values.
pub fn histogram_svg(title: &str, x_label: &str, series: &[Series], opts: HistOptions) -> String {
    let (edges, counts, excluded) = bin(series, opts.bins);
    let max_count = counts.iter().flatten().copied().max().unwrap_or(0) as f64;
    // From a count of 1/2, so that a bin holding one value stands off the axis.
    let y = Axis { lo: 0.5f64.log10(), ..Axis::over(&[0.0, max_count.max(10.0).log10()]) };
    let x = Axis::over(&[edges.first(), edges.last()].map(|e| e.copied().unwrap_or(f64::NAN)));
    let frame = Frame {
        legend: series.iter().map(|s| format!("{} (n={})", s.name, group_digits(s.values.len()))).collect(),
        empty: edges.is_empty().then_some("no values to show"),
        notes: excluded_note(series.iter().map(|s| s.name.as_str()), &excluded),
        ..Frame::new(title, (x_label, x), ("count", y))
    };
    frame.render((opts.width, opts.height), |chart| {
        let base = frame.y.lo;
        let height = |c: u64| (c as f64).log10().max(base);
        for (i, counts) in counts.iter().enumerate().filter(|(_, c)| c.iter().any(|&n| n > 0)) {
            // The outline of the bars as one step path, closed along the axis.
            let steps = counts.iter().enumerate().flat_map(|(k, &c)| [(edges[k], height(c)), (edges[k + 1], height(c))]);
            let outline: Vec<_> = [(edges[0], base)].into_iter().chain(steps).chain([(edges[counts.len()], base)]).collect();
            chart.draw_series([Polygon::new(outline.clone(), colour(i).mix(0.18).filled())])?;
            chart.draw_series([PathElement::new(outline, colour(i).stroke_width(2))])?;
        }
        Ok(())
    })
}

/// The shared edges of `bins` equal bins from the least to the greatest
/// plotted value (none when nothing could be placed), and per series its
/// counts and what could not be placed.
fn bin(series: &[Series], bins: usize) -> (Vec<f64>, Vec<Vec<u64>>, Vec<Excluded>) {
    let (placed, excluded): (Vec<Vec<f64>>, Vec<Excluded>) = series.iter().map(|s| place_all(&s.values)).unzip();
    let Some((lo, hi)) = span(&placed.concat()) else {
        return (Vec::new(), vec![Vec::new(); series.len()], excluded);
    };
    // One repeated value: its bin is a tenth of a decade wide.
    let (n, (lo, hi)) = (bins.max(1), if hi - lo < 0.1 { (lo - 0.05, hi + 0.05) } else { (lo, hi) });
    let edges: Vec<f64> = (0..=n).map(|i| lo + (hi - lo) * i as f64 / n as f64).collect();
    let mut counts = vec![vec![0u64; n]; series.len()];
    for (counts, placed) in counts.iter_mut().zip(&placed) {
        placed.iter().for_each(|&t| counts[edges[1..n].partition_point(|&e| e <= t)] += 1);
    }
    (edges, counts, excluded)
}

/// Points of each series, one colour each.
pub fn scatter_svg(title: &str, x_label: &str, y_label: &str, series: &[PointSeries], opts: ScatterOptions) -> String {
    let (mut drawn, mut not_shown, mut thinned) = (Vec::new(), Vec::new(), Vec::new());
    for s in series {
        let (mut placed, mut ex_x, mut ex_y) = (Vec::new(), Excluded::default(), Excluded::default());
        for &(x, y) in &s.points {
            match (place(x), place(y)) {
                (Some(tx), Some(ty)) => placed.push((tx, ty)),
                (None, _) => ex_x.note(x),
                (Some(_), None) => ex_y.note(y),
            }
        }
        let (dropped, of) = (ex_x.total() + ex_y.total(), if series.len() > 1 { format!(" of “{}”", s.name) } else { String::new() });
        let why: Vec<String> = [("x", ex_x), ("y", ex_y)].iter().filter_map(|(a, ex)| Some(format!("{a}: {}", ex.describe()?))).collect();
        if dropped > 0 {
            not_shown.push(format!("{} point{}{of} ({})", group_digits(dropped), if dropped == 1 { "" } else { "s" }, why.join("; ")));
        }
        let shown = downsample(&placed, opts.max_points);
        if shown.len() < placed.len() {
            thinned.push(format!("“{}”: {} of {}", s.name, group_digits(shown.len()), group_digits(placed.len())));
        }
        drawn.push(shown);
    }
    let mut notes: Vec<String> = not_shown.first().map(|_| format!("Not shown: {}.", not_shown.join("; "))).into_iter().collect();
    if !thinned.is_empty() {
        let (most, largest) = (group_digits(opts.max_points), group_digits(opts.max_points / 10));
        let how = format!("the extremes, the {largest} largest y, an even stride through the rest");
        notes.push(format!("Drawn: at most {most} points per series ({how}); {}.", thinned.join("; ")));
    }
    let (xs, ys): (Vec<f64>, Vec<f64>) = drawn.iter().flatten().copied().unzip();
    let frame = Frame {
        legend: series.iter().map(|s| format!("{} (n={})", s.name, group_digits(s.points.len()))).collect(),
        empty: xs.is_empty().then_some("no points to show"),
        notes,
        ..Frame::new(title, (x_label, Axis::over(&xs)), (y_label, Axis::over(&ys)))
    };
    frame.render((opts.width, opts.height), |chart| {
        for (i, points) in drawn.iter().enumerate() {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 2, colour(i).mix(0.65).filled())))?;
        }
        Ok(())
    })
}

/// At most `max_points` of `points`, chosen deterministically and kept in
/// input order: the extremes (least and greatest x and y), the largest y (a
/// tenth of the budget: the worst errors are not thinned away, and the band
/// of extra points they make at the top stays thin), then an even stride
/// through the rest.
fn downsample(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let (n, tail) = (points.len(), max_points / 10);
    if n <= max_points {
        return points.to_vec();
    }
    let by_x = |a: &usize, b: &usize| points[*a].0.total_cmp(&points[*b].0);
    let by_y = |a: &usize, b: &usize| points[*a].1.total_cmp(&points[*b].1);
    let mut by_y_descending: Vec<usize> = (0..n).collect();
    if tail > 0 {
        by_y_descending.select_nth_unstable_by(tail - 1, |a, b| by_y(b, a));
    }
    let (mut taken, mut chosen) = (vec![false; n], Vec::with_capacity(max_points));
    let extremes = [(0..n).min_by(by_x), (0..n).max_by(by_x), (0..n).min_by(by_y), (0..n).max_by(by_y)];
    for i in extremes.into_iter().flatten().chain(by_y_descending[..tail].iter().copied()) {
        if chosen.len() < max_points && !std::mem::replace(&mut taken[i], true) {
            chosen.push(i);
        }
    }
    // Exactly `budget` of the `rest` untaken points, evenly spaced.
    let (budget, rest) = (max_points - chosen.len(), n - chosen.len());
    let stride = (0..n).filter(|&i| !taken[i]).enumerate().filter(|(j, _)| (j + 1) * budget / rest > j * budget / rest);
    chosen.extend(stride.map(|(_, i)| i));
    chosen.sort_unstable();
    chosen.into_iter().map(|i| points[i]).collect()
}

/// One column per group: dots for up to `opts.max_points` values, a box from
/// the first to the third quartile with the median across it, whiskers to the
/// least and greatest value, and under the label "n=..." (every value given,
/// shown or not). A group with no values says "no tokens".
pub fn strip_svg(title: &str, y_label: &str, groups: &[(String, Vec<f64>)], opts: StripOptions) -> String {
    let (mut sorted, excluded): (Vec<Vec<f64>>, Vec<Excluded>) = groups.iter().map(|(_, values)| place_all(values)).unzip();
    sorted.iter_mut().for_each(|values| values.sort_unstable_by(f64::total_cmp));
    let mut notes = excluded_note(groups.iter().map(|(name, _)| name.as_str()), &excluded);
    if sorted.iter().any(|v| !v.is_empty()) {
        let dots = format!("dots: up to {} values per group at evenly spaced ranks", group_digits(opts.max_points));
        notes.push(format!("Box: first to third quartile, line at the median; whiskers: least to greatest value; {dots}."));
    }
    let ys: Vec<f64> = sorted.iter().flat_map(|v| v.first().into_iter().chain(v.last())).copied().collect();
    let columns = groups.len().max(1);
    let x = Axis { lo: 0.0, hi: columns as f64, ticks: Vec::new(), minor: Vec::new() };
    let label = |(name, given): &(String, Vec<f64>)| {
        [wrap(name, opts.width as usize / columns / 7), vec![format!("n={}", group_digits(given.len()))]].concat()
    };
    let frame = Frame {
        categories: groups.iter().map(label).collect(),
        empty: groups.is_empty().then_some("no groups"),
        notes,
        ..Frame::new(title, ("", x), (y_label, Axis::over(&ys)))
    };
    frame.render((opts.width, opts.height), |chart| {
        let half = 0.22f64.min(32.0 * columns as f64 / chart.plotting_area().dim_in_pixel().0 as f64);
        let ink = RGBColor(0x22, 0x22, 0x22);
        for (i, ((_, given), values)) in groups.iter().zip(&sorted).enumerate() {
            let (cx, m) = (i as f64 + 0.5, opts.max_points.min(values.len()));
            let Some([min, q1, median, q3, max]) = five_numbers(values) else {
                let what = if given.is_empty() { "no tokens" } else { "none shown" };
                chart.plotting_area().draw(&Text::new(what, (cx, (frame.y.lo + frame.y.hi) / 2.0), grey(11.0, FontStyle::Normal)))?;
                continue;
            };
            // Evenly spaced ranks, spread sideways by the golden-ratio sequence: the same picture every time.
            let rank = |k: usize| if m == 1 { 0 } else { k * (values.len() - 1) / (m - 1) };
            let dots = (0..m).map(|k| (cx + ((k as f64 * 0.618_034).fract() - 0.5) * 2.0 * half, values[rank(k)]));
            chart.draw_series(dots.map(|p| Circle::new(p, 2, colour(i).mix(0.45).filled())))?;
            let (l, r, cap) = (cx - half, cx + half, half / 2.0);
            chart.draw_series([Rectangle::new([(l, q1), (r, q3)], colour(i).mix(0.15).filled())])?;
            let lines = [vec![(l, q1), (r, q1), (r, q3), (l, q3), (l, q1)], vec![(cx, q3), (cx, max)], vec![(cx, q1), (cx, min)]];
            let caps = [vec![(cx - cap, max), (cx + cap, max)], vec![(cx - cap, min), (cx + cap, min)]];
            chart.draw_series(lines.into_iter().chain(caps).map(|line| PathElement::new(line, ink.stroke_width(1))))?;
            chart.draw_series([PathElement::new([(l, median), (r, median)], ink.stroke_width(3))])?;
        }
        Ok(())
    })
}

/// Least, first quartile, median, third quartile and greatest of sorted
/// values (quantiles linear between ranks), or None when there are none.
fn five_numbers(sorted: &[f64]) -> Option<[f64; 5]> {
    let last = sorted.len().checked_sub(1)? as f64;
    Some([0.0, 0.25, 0.5, 0.75, 1.0].map(|p: f64| {
        let (i, frac) = ((p * last).floor() as usize, (p * last).fract());
        sorted[i] * (1.0 - frac) + sorted.get(i + 1).map_or(0.0, |next| next * frac)
    }))
}

/// `s` with `& < > " '` replaced by entities: safe as HTML text and inside quoted attributes.
pub fn html_escape(s: &str) -> String {
    // '&' first, so that the entities written after it are not escaped again.
    [("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("\"", "&quot;"), ("'", "&#39;")].iter().fold(s.to_string(), |s, (c, e)| s.replace(c, e))
}

/// A table with every cell escaped; cells that read as a number are
/// right-aligned in tabular figures so columns of errors line up.
pub fn html_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let head: String = header.iter().map(|h| format!("<th>{}</th>", html_escape(h))).collect();
    let cell = |c: &String| format!("<td{}>{}</td>", if c.trim().parse::<f64>().is_ok() { r#" class="num""# } else { "" }, html_escape(c));
    let body: String = rows.iter().map(|row| format!("<tr>{}</tr>\n", row.iter().map(cell).collect::<String>())).collect();
    format!("<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n")
}

/// A complete HTML document: the title as its heading, a list of contents
/// when there are three sections or more, then each section (its HTML as given).
pub fn html_page(title: &str, body_sections: &[Section]) -> String {
    const CSS: &str = "body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1a1a1a;background:#fff;\
max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}h1{font-size:1.6rem;margin-bottom:.5rem}\
h2{font-size:1.2rem;margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}nav ol{padding-left:1.4rem}\
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}th,td{border:1px solid #d6d6d6;padding:.25rem .6rem;text-align:left;vertical-align:top}\
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}figure{margin:.6rem 0}\
svg{display:block;max-width:100%;height:auto}figcaption{font-size:.85rem;color:#444;max-width:45rem}\
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}pre{background:#f6f6f6;padding:.6rem;overflow-x:auto}";
    let (title, sections) = (html_escape(title), body_sections.iter().enumerate().map(|(i, s)| (i + 1, html_escape(&s.heading), &s.html)));
    let items: String = sections.clone().map(|(i, heading, _)| format!("<li><a href=\"#section-{i}\">{heading}</a></li>\n")).collect();
    let nav = if body_sections.len() >= 3 { format!("<nav><ol>\n{items}</ol></nav>\n") } else { String::new() };
    let body: String =
        sections.map(|(i, heading, html)| format!("<section id=\"section-{i}\">\n<h2>{heading}</h2>\n{html}\n</section>\n")).collect();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light\">\n<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>{title}</h1>\n\
         {nav}{body}</body>\n</html>\n"
    )
}

/// Where `v` goes on a log axis: log10 of it; None when it cannot be drawn there.
fn place(v: f64) -> Option<f64> {
    (v.is_finite() && v > 0.0).then(|| v.log10())
}

/// The values [`place`] puts on the axis, in order, and a count of the others.
fn place_all(values: &[f64]) -> (Vec<f64>, Excluded) {
    let mut excluded = Excluded::default();
    values.iter().filter(|&&v| place(v).is_none()).for_each(|&v| excluded.note(v));
    (values.iter().filter_map(|&v| place(v)).collect(), excluded)
}

/// The values of one series that [`place`] turned away, counted by reason (in the order of `REASONS`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Excluded([usize; 5]);

const REASONS: [(&str, &str); 5] =
    [("exact zero", "exact zeros"), ("negative value", "negative values"), ("NaN", "NaN"), ("+inf", "+inf"), ("-inf", "-inf")];

impl Excluded {
    /// Counts a value [`place`] refused (never a positive finite one, so `v > 0` means +inf).
    fn note(&mut self, v: f64) {
        self.0[[v == 0.0, v < 0.0 && v.is_finite(), v.is_nan(), v > 0.0].iter().position(|&b| b).unwrap_or(4)] += 1;
    }

    fn total(&self) -> usize {
        self.0.iter().sum()
    }

    /// "3 exact zeros, 1 NaN", or None when nothing was turned away.
    fn describe(&self) -> Option<String> {
        let parts = self.0.iter().zip(REASONS).filter(|(&n, _)| n > 0);
        let parts: Vec<String> =
            parts.map(|(&n, (one, many))| format!("{} {}", group_digits(n), if n == 1 { one } else { many })).collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// ["Not shown: 3 exact zeros in “fused”; 1 NaN in “chunked”."] (no names
/// when there is only one series), or nothing when all were shown.
fn excluded_note<'a>(names: impl ExactSizeIterator<Item = &'a str>, excluded: &[Excluded]) -> Vec<String> {
    let one = names.len() == 1;
    let named =
        names.zip(excluded).filter_map(|(name, ex)| Some(if one { ex.describe()? } else { format!("{} in “{name}”", ex.describe()?) }));
    let parts: Vec<String> = named.collect();
    (!parts.is_empty()).then(|| format!("Not shown: {}.", parts.join("; "))).into_iter().collect()
}

/// An axis in plotted units (log10 of the values) with its ticks, chosen
/// here; plotters draws it as it is (see its [`Ranged`]).
#[derive(Clone, Debug, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
}

impl Axis {
    /// Whole decades around the plotted `values` (NaN ignored; 1 to 10 when
    /// none), labelled every 1, 2, 5, 10, ... so at most about eight labels
    /// show; minor ticks at 2..9 x 10^k when decades are few.
    fn over(values: &[f64]) -> Axis {
        let (lo, hi) = span(values).unwrap_or((0.0, 1.0));
        // The nudge keeps an exact power of ten, whose log10 may be a hair off, on its decade.
        let (mut first, mut last) = ((lo + 1e-9).floor() as i64, (hi - 1e-9).ceil() as i64);
        if last <= first {
            (first, last) = (first - 1, first + 1);
        }
        let every = [1, 2, 5, 10, 20, 50, 100, 200].into_iter().find(|e| (last - first) / e <= 8).unwrap_or(500);
        (first, last) = (first.div_euclid(every) * every, -((-last).div_euclid(every)) * every);
        let minor = match every == 1 && last - first <= 6 {
            true => (first..last).flat_map(|k| (2..=9).map(move |m| k as f64 + (m as f64).log10())).collect(),
            false => (first..=last).filter(|k| k % every != 0).map(|k| k as f64).collect(),
        };
        let ticks = (first..=last).step_by(every as usize).map(|k| k as f64).collect();
        Axis { lo: first as f64, hi: last as f64, ticks, minor }
    }

    /// 1e-8; from 1 to 10^6 (counts, logit scales) plain: 1, 10, 100.
    fn label(&self, t: f64) -> String {
        let (k, plain) = (t.round() as i32, self.ticks.first().is_some_and(|&f| f >= 0.0) && self.hi <= 6.0);
        if plain {
            10u64.pow(k as u32).to_string()
        } else {
            format!("1e{k}")
        }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, t: &f64, limit: (i32, i32)) -> i32 {
        limit.0 + ((t - self.lo) / (self.hi - self.lo) * (limit.1 - limit.0) as f64).round() as i32
    }

    /// Grid lines and labels at the ticks, light grid lines at the minor ticks.
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() { &self.minor } else { &self.ticks }.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// Least and greatest of `values`, NaN ignored; None when there are none.
fn span(values: &[f64]) -> Option<(f64, f64)> {
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    (lo <= hi).then_some((lo, hi))
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Axis, Axis>>;
type Drawn = Result<(), Box<dyn std::error::Error>>;

/// What every plot has around its data: title, legend (series i in PALETTE
/// colour i), axes, labels under the columns of a strip plot, a message when
/// there is nothing to draw, and the caption's sentences.
struct Frame<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    x: Axis,
    y: Axis,
    legend: Vec<String>,
    categories: Vec<Vec<String>>,
    empty: Option<&'a str>,
    notes: Vec<String>,
}

impl<'a> Frame<'a> {
    fn new(title: &'a str, (x_label, x): (&'a str, Axis), (y_label, y): (&'a str, Axis)) -> Self {
        Frame { title, x_label, y_label, x, y, legend: Vec::new(), categories: Vec::new(), empty: None, notes: Vec::new() }
    }

    /// A `<figure>`: the inline SVG, and the notes as its caption.
    fn render(&self, size: (u32, u32), draw: impl FnOnce(&mut Chart) -> Drawn) -> String {
        let mut svg = String::new();
        let svg = match self.draw(&mut svg, (size.0.max(200), size.1.max(150)), draw) {
            Ok(()) => svg.replacen("<svg ", &format!("<svg role=\"img\" aria-label=\"{}\" ", html_escape(self.title)), 1),
            Err(e) => format!("<p>This plot could not be drawn: {}</p>", html_escape(&e.to_string())),
        };
        let notes = html_escape(&self.notes.join(" "));
        let caption = if notes.is_empty() { notes } else { format!("<figcaption>{notes}</figcaption>\n") };
        format!("<figure>\n{}\n{caption}</figure>\n", svg.trim_end())
    }

    fn draw(&self, out: &mut String, size: (u32, u32), draw: impl FnOnce(&mut Chart) -> Drawn) -> Drawn {
        let root = SVGBackend::with_string(out, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (width, left) = (size.0 as i32, 36 + 6 * self.y.ticks.iter().map(|&t| self.y.label(t).len()).max().unwrap_or(1) as i32);
        root.draw(&Text::new(self.title, (width / 2, 8), font(14.0, FontStyle::Bold).pos(Pos::new(HPos::Center, VPos::Top))))?;
        let (mut x, mut y) = (left, 32);
        for (i, name) in self.legend.iter().enumerate() {
            let item = 19 + (name.chars().count() as f64 * 11.0 * 0.58) as i32;
            if x + item > width - 12 && x > left {
                (x, y) = (left, y + 17);
            }
            root.draw(&Rectangle::new([(x, y + 1), (x + 14, y + 11)], colour(i).mix(0.3).filled()))?;
            root.draw(&Rectangle::new([(x, y + 1), (x + 14, y + 11)], colour(i).stroke_width(1)))?;
            root.draw(&Text::new(name.as_str(), (x + 19, y), font(11.0, FontStyle::Normal).pos(Pos::new(HPos::Left, VPos::Top))))?;
            x += item + 16;
        }
        let rows = self.categories.iter().map(Vec::len).max().unwrap_or(0) as i32;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(if self.legend.is_empty() { y } else { y + 22 })
            .margin_right(20)
            .x_label_area_size(if rows > 0 { 10 + 13 * rows } else { 40 })
            .y_label_area_size(left)
            .build_cartesian_2d(self.x.clone(), self.y.clone())?;
        let (x_label, y_label) = (|t: &f64| self.x.label(*t), |t: &f64| self.y.label(*t));
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(self.x_label).y_desc(self.y_label).x_label_formatter(&x_label).y_label_formatter(&y_label);
        mesh.label_style(font(10.0, FontStyle::Normal))
            .axis_desc_style(font(12.0, FontStyle::Normal))
            .axis_style(RGBColor(0x33, 0x33, 0x33));
        mesh.bold_line_style(RGBColor(0xe0, 0xe0, 0xe0)).light_line_style(RGBColor(0xf2, 0xf2, 0xf2)).draw()?;
        if let Some(message) = self.empty {
            let middle = ((self.x.lo + self.x.hi) / 2.0, (self.y.lo + self.y.hi) / 2.0);
            chart.plotting_area().draw(&Text::new(message, middle, grey(12.0, FontStyle::Italic)))?;
        }
        draw(&mut chart)?;
        for (i, lines) in self.categories.iter().enumerate() {
            let (cx, bottom) = chart.backend_coord(&(i as f64 + 0.5, self.y.lo));
            for (j, line) in lines.iter().enumerate() {
                let style = if j + 1 == lines.len() { grey(10.0, FontStyle::Normal) } else { font(10.0, FontStyle::Normal) };
                root.draw(&Text::new(line.as_str(), (cx, bottom + 6 + 13 * j as i32), style.pos(Pos::new(HPos::Center, VPos::Top))))?;
            }
        }
        Ok(root.present()?)
    }
}

/// Sans-serif text `px` pixels high as drawn (plotters writes font-size = size / 1.24).
fn font(px: f64, style: FontStyle) -> TextStyle<'static> {
    ("sans-serif", px * 1.24, style).into_font().color(&RGBColor(0x22, 0x22, 0x22))
}

/// Grey text centred on its point: notes in the plot, counts under the columns.
fn grey(px: f64, style: FontStyle) -> TextStyle<'static> {
    font(px, style).color(&RGBColor(0x66, 0x66, 0x66)).pos(Pos::new(HPos::Center, VPos::Center))
}

fn colour(i: usize) -> RGBColor {
    let rgb = u32::from_str_radix(&PALETTE[i % PALETTE.len()][1..], 16).unwrap_or(0);
    RGBColor((rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8)
}

/// Words of `text` in lines of at most `max_chars` characters (a longer word gets a line of its own).
fn wrap(text: &str, max_chars: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= max_chars => *line += &format!(" {word}"),
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// 1234567 as "1,234,567".
fn group_digits(n: usize) -> String {
    let reversed: Vec<char> = n.to_string().chars().rev().collect();
    reversed.chunks(3).map(|c| c.iter().rev().collect::<String>()).rev().collect::<Vec<_>>().join(",")
}

#[cfg(test)]
#[path = "plots_tests.rs"]
mod tests;
