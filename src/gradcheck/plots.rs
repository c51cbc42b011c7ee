//! Plots for the `gradcheck` report: how an implementation's errors against
//! the oracle are distributed, as inline SVG inside one self-contained HTML
//! page (no scripts, fonts or external references; it opens offline).
//!
//! - [`histogram_svg`]: overlaid histograms, one outline per series, usually
//!   of |error| on a log axis, with vertical reference lines (a bound).
//! - [`scatter_svg`]: points on linear or log axes, thinned to a fixed
//!   number per series so a million tokens stay a small file, with
//!   horizontal reference lines.
//! - [`strip_svg`]: one column per category ("clipped high, A<0", "at a
//!   kink"): a box from the quartiles, the median, whiskers to min and max,
//!   a strip of sample values, and the count under the label.
//! - [`html_page`], [`html_table`], [`html_escape`]: the page around them.
//!
//! No value is dropped silently. A value a plot cannot place (NaN, an
//! infinity, and on a log axis a zero or a negative) is counted per series
//! and named in a caption under the plot: "Not shown: 3 exact zeros in
//! fused." Histograms only count into bins, so their cost is one pass over
//! the values and their size depends on the bin count, not on the data.

use std::fmt::Write as _;

/// The Okabe–Ito palette, told apart under the common colour-vision
/// deficiencies. Its yellow is left out: it cannot be read on white.
pub const PALETTE: [&str; 7] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000"];

/// One named set of values, e.g. |error| of one implementation's gradient.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HistOptions {
    /// About how many bins span the data; the bin width is rounded to a
    /// 1, 2 or 5 x 10^k so bin edges are round numbers. All series share bins.
    pub bins: usize,
    /// Bin log10 of the values and label the x axis in decades (1e-8, ...).
    /// Pass plain |error| values; zeros and negatives are then not shown.
    pub log_x: bool,
    /// Counts on a log axis, so a tail of three values stays visible next
    /// to a peak of a million.
    pub log_count: bool,
    /// Vertical reference lines, (label, x) with x in data units (the plain
    /// value even when `log_x`).
    pub markers: Vec<(String, f64)>,
    pub width: u32,
    pub height: u32,
}

impl Default for HistOptions {
    fn default() -> Self {
        HistOptions { bins: 40, log_x: false, log_count: false, markers: Vec::new(), width: 640, height: 360 }
    }
}

/// One named set of (x, y) points.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PointSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ScatterOptions {
    pub log_x: bool,
    pub log_y: bool,
    /// At most this many points are drawn per series: the extremes, the
    /// largest y values and an even stride through the rest (see the caption).
    pub max_points: usize,
    /// Horizontal reference lines, (label, y) in data units.
    pub markers: Vec<(String, f64)>,
    pub width: u32,
    pub height: u32,
}

impl Default for ScatterOptions {
    fn default() -> Self {
        ScatterOptions { log_x: false, log_y: false, max_points: 2000, markers: Vec::new(), width: 640, height: 360 }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct StripOptions {
    pub log_y: bool,
    /// At most this many sample values are drawn as dots per group, at
    /// evenly spaced ranks (so always the min and the max).
    pub max_points: usize,
    /// Horizontal reference lines, (label, y) in data units.
    pub markers: Vec<(String, f64)>,
    pub width: u32,
    pub height: u32,
}

impl Default for StripOptions {
    fn default() -> Self {
        StripOptions { log_y: false, max_points: 200, markers: Vec::new(), width: 640, height: 360 }
    }
}

/// One part of an HTML page: a heading (escaped here) over raw HTML (an
/// SVG from this module, an [`html_table`], or the caller's own markup).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Section {
    pub heading: String,
    pub html: String,
}

// ---------------------------------------------------------------------------
// Histogram

/// Overlaid histograms of `series` over shared bins, one colour each, with
/// a legend giving each series' number of values.
pub fn histogram_svg(title: &str, x_label: &str, series: &[Series], opts: HistOptions) -> String {
    let hist = Histogram::count(series, opts.bins, opts.log_x);
    let (markers, mut notes) = place_markers(&opts.markers, opts.log_x);

    let mut x_span = Span::EMPTY;
    if let Some(end) = hist.end() {
        x_span.include(hist.edge(0));
        x_span.include(end);
        // One repeated value: keep the widened range, not just its one bin.
        let (lo, hi) = widen_if_flat(hist.data.lo, hist.data.hi);
        x_span.include(lo);
        x_span.include(hi);
    }
    for (_, t) in &markers {
        x_span.include(*t);
    }
    let x = axis_over(x_span, opts.log_x);

    let max_count = hist.counts.iter().flatten().copied().max().unwrap_or(0);
    let y = if opts.log_count {
        let mut y = log_axis(0.0, (max_count.max(10) as f64).log10());
        // Start at a count of 1/2 so a bin holding 1 value stands off the axis.
        y.lo = 0.5f64.log10();
        y
    } else {
        linear_axis(0.0, max_count.max(5) as f64, 5)
    };
    let empty_bin = y.lo;
    let count_at = |c: u64| {
        if opts.log_count {
            if c == 0 {
                empty_bin
            } else {
                (c as f64).log10()
            }
        } else {
            c as f64
        }
    };

    let named: Vec<(&str, &Excluded)> = series.iter().map(|s| s.name.as_str()).zip(&hist.excluded).collect();
    notes.extend(excluded_note(&named));

    let chart = Chart {
        title,
        x_label,
        y_label: "count",
        width: opts.width,
        height: opts.height,
        legend: series
            .iter()
            .map(|s| format!("{} (n={})", s.name, group_digits(s.values.len())))
            .zip(PALETTE.iter().cycle().copied())
            .collect(),
        swatch: Swatch::Area,
        categories: Vec::new(),
        notes,
        x,
        y,
    };
    chart.render(|frame, out| {
        if hist.end().is_none() {
            frame.message(out, "no values to show");
        }
        for (counts, colour) in hist.counts.iter().zip(PALETTE.iter().cycle()) {
            if counts.iter().all(|&c| c == 0) {
                continue;
            }
            // The outline of the bars as one step path, closed along the axis.
            let base = frame.py(chart.y.lo);
            let mut d = format!("M{:.1},{:.1}", frame.px(hist.edge(0)), base);
            for (i, &c) in counts.iter().enumerate() {
                let _ = write!(d, "V{:.1}H{:.1}", frame.py(count_at(c)), frame.px(hist.edge(i + 1)));
            }
            let _ = write!(d, "V{:.1}Z", base);
            let _ = writeln!(
                out,
                r#"<path d="{d}" fill="{colour}" fill-opacity="0.18" stroke="{colour}" stroke-width="1.5" stroke-linejoin="round"/>"#
            );
        }
        for (i, (label, t)) in markers.iter().enumerate() {
            frame.vertical_marker(out, label, *t, i);
        }
    })
}

/// Counts of every series over shared bins, in plotted units (log10 of the
/// value when binning on a log axis). Edges are whole multiples of the width
/// w: bin i is [(first + i) w, (first + i + 1) w).
struct Histogram {
    /// The multiple of `width` at which bin 0 starts.
    first: f64,
    width: f64,
    counts: Vec<Vec<u64>>,
    excluded: Vec<Excluded>,
    /// Least and greatest plotted value over all series.
    data: Span,
}

impl Histogram {
    fn count(series: &[Series], bins: usize, log: bool) -> Histogram {
        let mut data = Span::EMPTY;
        let mut excluded = vec![Excluded::default(); series.len()];
        for (s, ex) in series.iter().zip(&mut excluded) {
            for &v in &s.values {
                match place(v, log) {
                    Some(t) => data.include(t),
                    None => ex.note(v, log),
                }
            }
        }
        if data.is_empty() {
            return Histogram { first: 0.0, width: 1.0, counts: vec![Vec::new(); series.len()], excluded, data };
        }
        let (lo, hi) = widen_if_flat(data.lo, data.hi);
        let width = nice_step((hi / bins.max(1) as f64) - (lo / bins.max(1) as f64));
        // Bin indices come from t / w alone, never from t - start, which
        // would lose a small t next to a start of 1e300.
        let first = (data.lo / width).floor();
        let n = ((data.hi / width).floor() - first) as usize + 1;
        let counts = series
            .iter()
            .map(|s| {
                let mut counts = vec![0u64; n];
                for t in s.values.iter().filter_map(|&v| place(v, log)) {
                    counts[(((t / width).floor() - first) as usize).min(n - 1)] += 1;
                }
                counts
            })
            .collect();
        Histogram { first, width, counts, excluded, data }
    }

    /// The left edge of bin i (the right edge of the last bin at i = n),
    /// held within the finite numbers at the ends of the f64 range.
    fn edge(&self, i: usize) -> f64 {
        ((self.first + i as f64) * self.width).clamp(-f64::MAX, f64::MAX)
    }

    /// The right edge of the last bin, or None when nothing was placed.
    fn end(&self) -> Option<f64> {
        let n = self.counts.first().map_or(0, Vec::len);
        (n > 0).then(|| self.edge(n))
    }
}

// ---------------------------------------------------------------------------
// Scatter

/// Points of each series, one colour each, with horizontal reference lines.
pub fn scatter_svg(title: &str, x_label: &str, y_label: &str, series: &[PointSeries], opts: ScatterOptions) -> String {
    let (markers, mut notes) = place_markers(&opts.markers, opts.log_y);
    let (mut x_span, mut y_span) = (Span::EMPTY, Span::EMPTY);
    let mut drawn = Vec::with_capacity(series.len());
    let mut not_shown = Vec::new();
    let mut thinned = Vec::new();
    for s in series {
        let (mut ex_x, mut ex_y) = (Excluded::default(), Excluded::default());
        let placed: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|&(x, y)| match (place(x, opts.log_x), place(y, opts.log_y)) {
                (Some(tx), Some(ty)) => Some((tx, ty)),
                (None, _) => {
                    ex_x.note(x, opts.log_x);
                    None
                }
                (Some(_), None) => {
                    ex_y.note(y, opts.log_y);
                    None
                }
            })
            .collect();
        for &(tx, ty) in &placed {
            x_span.include(tx);
            y_span.include(ty);
        }
        let dropped = ex_x.total() + ex_y.total();
        if dropped > 0 {
            let why: Vec<String> =
                [("x", ex_x), ("y", ex_y)].iter().filter_map(|(axis, ex)| ex.describe().map(|d| format!("{axis}: {d}"))).collect();
            let of = if series.len() > 1 { format!(" of {}", quoted(&s.name)) } else { String::new() };
            not_shown.push(format!("{} point{}{of} ({})", group_digits(dropped), plural(dropped), why.join("; ")));
        }
        let shown = downsample(&placed, opts.max_points);
        if shown.len() < placed.len() {
            thinned.push(format!("{}: {} of {}", quoted(&s.name), group_digits(shown.len()), group_digits(placed.len())));
        }
        drawn.push(shown);
    }
    if !not_shown.is_empty() {
        notes.push(format!("Not shown: {}.", not_shown.join("; ")));
    }
    if !thinned.is_empty() {
        notes.push(format!(
            "Drawn: at most {} points per series (the extremes, the {} largest y, an even stride through the rest); {}.",
            group_digits(opts.max_points),
            group_digits(largest_kept(opts.max_points)),
            thinned.join("; ")
        ));
    }
    for (_, t) in &markers {
        y_span.include(*t);
    }

    let chart = Chart {
        title,
        x_label,
        y_label,
        width: opts.width,
        height: opts.height,
        x: axis_over(x_span, opts.log_x),
        y: axis_over(y_span, opts.log_y),
        legend: series
            .iter()
            .map(|s| format!("{} (n={})", s.name, group_digits(s.points.len())))
            .zip(PALETTE.iter().cycle().copied())
            .collect(),
        swatch: Swatch::Dot,
        categories: Vec::new(),
        notes,
    };
    chart.render(|frame, out| {
        if drawn.iter().all(Vec::is_empty) {
            frame.message(out, "no points to show");
        }
        for (points, colour) in drawn.iter().zip(PALETTE.iter().cycle()) {
            if points.is_empty() {
                continue;
            }
            // Each point a short round-capped stroke: a dot in a dozen bytes.
            let mut d = String::with_capacity(points.len() * 14);
            for &(tx, ty) in points {
                let _ = write!(d, "M{:.1},{:.1}h0.1", frame.px(tx), frame.py(ty));
            }
            let _ = writeln!(
                out,
                r#"<path d="{d}" fill="none" stroke="{colour}" stroke-opacity="0.65" stroke-width="4" stroke-linecap="round"/>"#
            );
        }
        for (i, (label, t)) in markers.iter().enumerate() {
            frame.horizontal_marker(out, label, *t, i);
        }
    })
}

/// At most `max_points` of `points`, chosen deterministically and kept in
/// input order: first the extremes (least and greatest x and y), then the
/// [`largest_kept`] largest y (so the worst errors are not thinned away),
/// then an even stride through the rest.
fn downsample(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let n = points.len();
    if n <= max_points {
        return points.to_vec();
    }
    let mut taken = vec![false; n];
    let mut chosen = Vec::with_capacity(max_points);
    let mut take = |i: usize, taken: &mut Vec<bool>| {
        if chosen.len() < max_points && !taken[i] {
            taken[i] = true;
            chosen.push(i);
        }
    };
    let by_x = |a: &usize, b: &usize| points[*a].0.total_cmp(&points[*b].0);
    let by_y = |a: &usize, b: &usize| points[*a].1.total_cmp(&points[*b].1);
    for i in [(0..n).min_by(by_x), (0..n).max_by(by_x), (0..n).min_by(by_y), (0..n).max_by(by_y)].into_iter().flatten() {
        take(i, &mut taken);
    }
    let tail = largest_kept(max_points);
    if tail > 0 {
        let mut order: Vec<usize> = (0..n).collect();
        order.select_nth_unstable_by(tail - 1, |a, b| by_y(b, a));
        for &i in &order[..tail] {
            take(i, &mut taken);
        }
    }
    let budget = max_points - chosen.len();
    let rest = n - chosen.len();
    // Picks exactly `budget` of the `rest` untaken points, evenly spaced.
    let mut j = 0;
    for (i, &was_taken) in taken.iter().enumerate() {
        if was_taken {
            continue;
        }
        if (j + 1) * budget / rest > j * budget / rest {
            chosen.push(i);
        }
        j += 1;
    }
    chosen.sort_unstable();
    chosen.into_iter().map(|i| points[i]).collect()
}

/// How many of the largest y [`downsample`] keeps ahead of the stride: a
/// tenth of the budget, so the worst errors stay in the picture while the
/// band of extra points they make at the top stays thin.
fn largest_kept(max_points: usize) -> usize {
    max_points / 10
}

// ---------------------------------------------------------------------------
// Strip

/// One column per group: dots for up to `opts.max_points` values, a box
/// from the first to the third quartile with the median across it, whiskers
/// to the least and greatest value, and "n=..." under the label (n counts
/// every value given, shown or not). A group with no values says "no
/// tokens"; hovering over a box shows its numbers.
pub fn strip_svg(title: &str, y_label: &str, groups: &[(String, Vec<f64>)], opts: StripOptions) -> String {
    let (markers, mut notes) = place_markers(&opts.markers, opts.log_y);
    let mut y_span = Span::EMPTY;
    let mut excluded = vec![Excluded::default(); groups.len()];
    let sorted: Vec<Vec<f64>> = groups
        .iter()
        .zip(&mut excluded)
        .map(|((_, values), ex)| {
            let mut kept: Vec<f64> = values
                .iter()
                .copied()
                .filter(|&v| {
                    let placed = place(v, opts.log_y).is_some();
                    if !placed {
                        ex.note(v, opts.log_y);
                    }
                    placed
                })
                .collect();
            kept.sort_unstable_by(f64::total_cmp);
            kept
        })
        .collect();
    for values in &sorted {
        if let (Some(&lo), Some(&hi)) = (values.first(), values.last()) {
            y_span.include(place(lo, opts.log_y).unwrap());
            y_span.include(place(hi, opts.log_y).unwrap());
        }
    }
    for (_, t) in &markers {
        y_span.include(*t);
    }
    let named: Vec<(&str, &Excluded)> = groups.iter().map(|(name, _)| name.as_str()).zip(&excluded).collect();
    notes.extend(excluded_note(&named));
    if sorted.iter().any(|v| !v.is_empty()) {
        notes.push(format!(
            "Box: first to third quartile, line at the median; whiskers: least to greatest value; dots: up to {} values per group at evenly spaced ranks.",
            group_digits(opts.max_points)
        ));
    }

    let columns = groups.len().max(1) as f64;
    let chart = Chart {
        title,
        x_label: "",
        y_label,
        width: opts.width,
        height: opts.height,
        x: Axis { lo: 0.0, hi: columns, ticks: Vec::new(), minor: Vec::new() },
        y: axis_over(y_span, opts.log_y),
        legend: Vec::new(),
        swatch: Swatch::Dot,
        categories: groups.iter().map(|(name, values)| (name.clone(), format!("n={}", group_digits(values.len())))).collect(),
        notes,
    };
    let y_of = |v: f64| place(v, opts.log_y).unwrap();
    chart.render(|frame, out| {
        if groups.is_empty() {
            frame.message(out, "no groups");
        }
        let column_px = (frame.right - frame.left) / columns;
        let box_half = (column_px * 0.22).min(32.0);
        for (i, (((name, given), values), colour)) in groups.iter().zip(&sorted).zip(PALETTE.iter().cycle()).enumerate() {
            let cx = frame.px(i as f64 + 0.5);
            let Some(s) = Spread::of(values) else {
                let what = if given.is_empty() { "no tokens" } else { "none shown" };
                let _ = writeln!(
                    out,
                    r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="#666" font-style="italic">{what}</text>"##,
                    (frame.top + frame.bottom) / 2.0
                );
                continue;
            };
            let mut dots = String::new();
            for (k, v) in spaced_ranks(values, opts.max_points).enumerate() {
                let x = cx + jitter(k) * 2.0 * box_half;
                let _ = write!(dots, "M{:.1},{:.1}h0.1", x, frame.py(y_of(v)));
            }
            let _ = writeln!(
                out,
                r#"<path d="{dots}" fill="none" stroke="{colour}" stroke-opacity="0.45" stroke-width="3.5" stroke-linecap="round"/>"#
            );
            let tooltip = format!(
                "{name}: n={}{}, min {}, q1 {}, median {}, q3 {}, max {}",
                group_digits(given.len()),
                if values.len() < given.len() { format!(" ({} shown)", group_digits(values.len())) } else { String::new() },
                sci(s.min),
                sci(s.q1),
                sci(s.median),
                sci(s.q3),
                sci(s.max)
            );
            let [min, q1, median, q3, max] = [s.min, s.q1, s.median, s.q3, s.max].map(|v| frame.py(y_of(v)));
            let cap = box_half / 2.0;
            // Whiskers from the box to the extremes, with caps; the box; the median across it.
            let whiskers = format!(
                "M{cx:.1},{max:.1}V{q3:.1}M{cx:.1},{q1:.1}V{min:.1}M{:.1},{max:.1}h{:.1}M{:.1},{min:.1}h{:.1}",
                cx - cap,
                2.0 * cap,
                cx - cap,
                2.0 * cap
            );
            let _ = writeln!(
                out,
                r##"<g stroke="#222" stroke-width="1.2"><title>{}</title><path d="{whiskers}" fill="none"/><rect x="{:.1}" y="{q3:.1}" width="{:.1}" height="{:.1}" fill="{colour}" fill-opacity="0.15"/><path d="M{:.1},{median:.1}h{:.1}" stroke-width="2.5"/></g>"##,
                html_escape(&tooltip),
                cx - box_half,
                2.0 * box_half,
                q1 - q3,
                cx - box_half,
                2.0 * box_half,
            );
        }
        for (i, (label, t)) in markers.iter().enumerate() {
            frame.horizontal_marker(out, label, *t, i);
        }
    })
}

/// Least, quartiles, median and greatest of sorted values (quantiles
/// interpolated linearly between ranks), or None when there are none.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    min: f64,
    q1: f64,
    median: f64,
    q3: f64,
    max: f64,
}

impl Spread {
    fn of(sorted: &[f64]) -> Option<Spread> {
        let quantile = |p: f64| {
            let at = p * (sorted.len() - 1) as f64;
            let i = at.floor() as usize;
            let frac = at - i as f64;
            match sorted.get(i + 1) {
                // Weighted sum, not a difference: finite for any finite pair.
                Some(&next) if frac > 0.0 => sorted[i] * (1.0 - frac) + next * frac,
                _ => sorted[i],
            }
        };
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        Some(Spread { min, q1: quantile(0.25), median: quantile(0.5), q3: quantile(0.75), max })
    }
}

/// At most `m` of the sorted values at evenly spaced ranks, first and last included.
fn spaced_ranks(sorted: &[f64], m: usize) -> impl Iterator<Item = f64> + '_ {
    let n = sorted.len();
    let m = m.min(n);
    (0..m).map(move |k| if m == 1 { sorted[n - 1] } else { sorted[k * (n - 1) / (m - 1)] })
}

/// A fixed offset in [-0.5, 0.5) for the k-th dot of a strip (splitmix64),
/// so the same data always draws the same picture.
fn jitter(k: usize) -> f64 {
    let mut z = (k as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 - 0.5
}

// ---------------------------------------------------------------------------
// HTML

/// `s` with `& < > " '` replaced by entities: safe as HTML or XML text and
/// inside quoted attributes.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A table with every cell escaped; cells that read as a number are
/// right-aligned in tabular figures so columns of errors line up.
pub fn html_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table>\n<thead><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", html_escape(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let class = if cell.trim().parse::<f64>().is_ok() { r#" class="num""# } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", html_escape(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// A complete HTML document: the title as its heading, a list of contents
/// when there are three sections or more, then each section. Section HTML
/// is inserted as given; headings are escaped.
pub fn html_page(title: &str, body_sections: &[Section]) -> String {
    const CSS: &str = "\
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1a1a1a;background:#fff;\
max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}\
h1{font-size:1.6rem;margin-bottom:.5rem}\
h2{font-size:1.2rem;margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}\
nav ol{padding-left:1.4rem}\
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}\
th,td{border:1px solid #d6d6d6;padding:.25rem .6rem;text-align:left;vertical-align:top}\
th{background:#f3f3f3}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
svg{display:block;max-width:100%;height:auto;margin:.6rem 0}\
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}\
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto}";
    let title = html_escape(title);
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light\">\n<title>{title}</title>\n<style>{CSS}</style>\n\
         </head>\n<body>\n<h1>{title}</h1>\n"
    );
    if body_sections.len() >= 3 {
        out.push_str("<nav><ol>\n");
        for (i, s) in body_sections.iter().enumerate() {
            let _ = writeln!(out, "<li><a href=\"#section-{}\">{}</a></li>", i + 1, html_escape(&s.heading));
        }
        out.push_str("</ol></nav>\n");
    }
    for (i, s) in body_sections.iter().enumerate() {
        let _ = write!(out, "<section id=\"section-{}\">\n<h2>{}</h2>\n{}\n</section>\n", i + 1, html_escape(&s.heading), s.html);
    }
    out.push_str("</body>\n</html>\n");
    out
}

// ---------------------------------------------------------------------------
// Values that cannot be drawn

/// Where `v` goes on an axis: itself, or log10 of it on a log axis; None
/// when it cannot be drawn there.
fn place(v: f64, log: bool) -> Option<f64> {
    if !v.is_finite() || (log && v <= 0.0) {
        None
    } else if log {
        Some(v.log10())
    } else {
        Some(v)
    }
}

/// The values of one series that [`place`] turned away, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Excluded {
    nan: usize,
    pos_inf: usize,
    neg_inf: usize,
    zeros: usize,
    negative: usize,
}

impl Excluded {
    /// Counts a value `place(v, log)` refused.
    fn note(&mut self, v: f64, log: bool) {
        if v.is_nan() {
            self.nan += 1;
        } else if v == f64::INFINITY {
            self.pos_inf += 1;
        } else if v == f64::NEG_INFINITY {
            self.neg_inf += 1;
        } else if log && v == 0.0 {
            self.zeros += 1;
        } else if log && v < 0.0 {
            self.negative += 1;
        }
    }

    fn total(&self) -> usize {
        self.nan + self.pos_inf + self.neg_inf + self.zeros + self.negative
    }

    /// "3 exact zeros, 1 NaN", or None when nothing was turned away.
    fn describe(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.zeros, "exact zero", "exact zeros"),
            (self.negative, "negative value", "negative values"),
            (self.nan, "NaN", "NaN"),
            (self.pos_inf, "+inf", "+inf"),
            (self.neg_inf, "-inf", "-inf"),
        ]
        .iter()
        .filter(|(n, ..)| *n > 0)
        .map(|&(n, one, many)| format!("{} {}", group_digits(n), if n == 1 { one } else { many }))
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// "Not shown: 3 exact zeros in “fused”; 1 NaN in “chunked”." (the names
/// left out when there is only one series), or None when all were shown.
fn excluded_note(named: &[(&str, &Excluded)]) -> Option<String> {
    let parts: Vec<String> = named
        .iter()
        .filter_map(|(name, ex)| {
            let what = ex.describe()?;
            Some(if named.len() == 1 { what } else { format!("{what} in {}", quoted(name)) })
        })
        .collect();
    (!parts.is_empty()).then(|| format!("Not shown: {}.", parts.join("; ")))
}

/// Reference lines that can be drawn, in plotted units, and a note for each
/// one that cannot.
fn place_markers(markers: &[(String, f64)], log: bool) -> (Vec<(String, f64)>, Vec<String>) {
    let mut placed = Vec::new();
    let mut notes = Vec::new();
    for (label, v) in markers {
        match place(*v, log) {
            Some(t) => placed.push((label.clone(), t)),
            None => notes.push(format!(
                "Reference line {} at {v} is not drawn: {}.",
                quoted(label),
                if v.is_finite() { "a log axis has no place for it" } else { "it is not finite" }
            )),
        }
    }
    (placed, notes)
}

// ---------------------------------------------------------------------------
// Axes and ticks

/// Least and greatest of some plotted values.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Span {
    lo: f64,
    hi: f64,
}

impl Span {
    const EMPTY: Span = Span { lo: f64::INFINITY, hi: f64::NEG_INFINITY };

    fn include(&mut self, t: f64) {
        self.lo = self.lo.min(t);
        self.hi = self.hi.max(t);
    }

    fn is_empty(&self) -> bool {
        self.lo > self.hi
    }
}

/// An axis in plotted units (log10 of the value on a log axis): its range,
/// labelled ticks, and unlabelled minor ticks. Always `lo < hi`.
#[derive(Clone, Debug, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<(f64, String)>,
    minor: Vec<f64>,
}

/// A linear or log axis covering `span` (a placeholder range when empty).
fn axis_over(span: Span, log: bool) -> Axis {
    match (span.is_empty(), log) {
        (true, false) => linear_axis(0.0, 1.0, 5),
        (true, true) => log_axis(-1.0, 0.0),
        (false, false) => linear_axis(span.lo, span.hi, 5),
        (false, true) => log_axis(span.lo, span.hi),
    }
}

/// A range that can be divided: a single value (or one whose spread is
/// below what its ticks could label) becomes that value +- 10% (+-1 at 0).
fn widen_if_flat(lo: f64, hi: f64) -> (f64, f64) {
    let magnitude = lo.abs().max(hi.abs());
    if hi - lo > magnitude * 1e-12 {
        return (lo, hi);
    }
    let mid = lo / 2.0 + hi / 2.0;
    let half = if mid == 0.0 { 1.0 } else { (mid.abs() * 0.1).max(1e-300) };
    (mid - half, mid + half)
}

/// The 1, 2 or 5 x 10^k nearest to `raw` (> 0) on a log scale.
fn nice_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction < 1.5 {
        1.0
    } else if fraction < 3.5 {
        2.0
    } else if fraction < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// Ticks at multiples of a 1, 2 or 5 x 10^k step, about `intervals` of
/// them across [lo, hi]; the axis ends on the ticks either side of the data.
fn linear_axis(lo: f64, hi: f64, intervals: usize) -> Axis {
    let (lo, hi) = widen_if_flat(lo, hi);
    let n = intervals.max(1) as f64;
    let step = nice_step(hi / n - lo / n);
    // Near f64::MAX the tick beyond the data would overflow: stop short of it.
    let limit = (f64::MAX / step).floor();
    let (first, last) = ((lo / step).floor().max(-limit) as i64, (hi / step).ceil().min(limit) as i64);
    let largest = (first as f64 * step).abs().max((last as f64 * step).abs());
    let ticks = (first..=last)
        .map(|k| {
            // A multiple of the step, never a running sum.
            let v = k as f64 * step;
            (v, tick_label(v, step, largest))
        })
        .collect();
    Axis { lo: first as f64 * step, hi: last as f64 * step, ticks, minor: Vec::new() }
}

/// The label of tick `v` on an axis with this step whose largest tick has
/// magnitude `largest`: plain decimals with as many places as the step
/// needs ("0.25" never occurs, "2.5" does), else scientific with as many
/// digits as tell neighbouring ticks apart ("1.5e-9").
fn tick_label(v: f64, step: f64, largest: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    let step_power = (step.log10() + 1e-9).floor() as i32;
    if step_power >= -4 && largest < 1e7 {
        format!("{:.*}", (-step_power).max(0) as usize, v)
    } else {
        let largest_power = (largest.log10() + 1e-9).floor() as i32;
        format!("{:.*e}", (largest_power - step_power).max(0) as usize, v)
    }
}

/// A log axis over plotted units [lo, hi] (log10 of the values), ending on
/// whole decades; labelled every 1, 2, 5, 10, ... decades so at most about
/// eight labels show, with minor ticks at 2..9 x 10^k when decades are few.
fn log_axis(lo: f64, hi: f64) -> Axis {
    // The nudge keeps an exact power of ten, whose log10 may come out a hair
    // off, on its own decade.
    let (mut first, mut last) = ((lo + 1e-9).floor() as i64, (hi - 1e-9).ceil() as i64);
    if last <= first {
        first -= 1;
        last = first + 2;
    }
    let every = [1, 2, 5, 10, 20, 50, 100, 200].into_iter().find(|e| (last - first) / e <= 8).unwrap_or(500);
    first = first.div_euclid(every) * every;
    last = -((-last).div_euclid(every)) * every;
    // Counts (0..=6 decades) read better as 1, 10, 100 than as 1e0, 1e1, 1e2.
    let plain = first >= 0 && last <= 6;
    let ticks = (first..=last)
        .step_by(every as usize)
        .map(|k| (k as f64, if plain { format!("{}", 10u64.pow(k as u32)) } else { format!("1e{k}") }))
        .collect();
    let minor = if every == 1 && last - first <= 6 {
        (first..last).flat_map(|k| (2..=9).map(move |m| k as f64 + (m as f64).log10())).collect()
    } else {
        (first..=last).filter(|k| k % every != 0).map(|k| k as f64).collect()
    };
    Axis { lo: first as f64, hi: last as f64, ticks, minor }
}

// ---------------------------------------------------------------------------
// Drawing: layout shared by every plot

const TICK_FONT: f64 = 10.0;
const LEGEND_FONT: f64 = 11.0;
const CAPTION_FONT: f64 = 10.5;
const LINE: f64 = 13.0;

#[derive(Clone, Copy)]
enum Swatch {
    Area,
    Dot,
}

/// What every plot has: title, axes, legend, category labels, caption.
struct Chart<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    width: u32,
    height: u32,
    x: Axis,
    y: Axis,
    legend: Vec<(String, &'static str)>,
    swatch: Swatch,
    /// Strip plots: per column, its label (wrapped to the column) and a
    /// second line (the count). Columns span x in [i, i + 1).
    categories: Vec<(String, String)>,
    /// Sentences for the caption under the plot.
    notes: Vec<String>,
}

/// The plot area in px, and the mapping from plotted units into it.
struct Frame {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn px(&self, t: f64) -> f64 {
        self.left + fraction(t, self.x) * (self.right - self.left)
    }

    fn py(&self, t: f64) -> f64 {
        self.bottom - fraction(t, self.y) * (self.bottom - self.top)
    }

    fn message(&self, out: &mut String, text: &str) {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666" font-style="italic">{}</text>"##,
            (self.left + self.right) / 2.0,
            (self.top + self.bottom) / 2.0,
            html_escape(text)
        );
    }

    /// A dashed vertical line at plotted x `t`, its label at the top; the
    /// i-th marker's label sits one line lower so neighbours do not collide.
    fn vertical_marker(&self, out: &mut String, label: &str, t: f64, i: usize) {
        let x = self.px(t);
        let (anchor, dx) = if x > (self.left + self.right) / 2.0 { ("end", -4.0) } else { ("start", 4.0) };
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#222" stroke-width="1.2" stroke-dasharray="5 3"/><text x="{:.1}" y="{:.1}" text-anchor="{anchor}" {HALO}>{}</text>"##,
            self.top,
            self.bottom,
            x + dx,
            self.top + 12.0 + i as f64 * LINE,
            html_escape(label)
        );
    }

    /// A dashed horizontal line at plotted y `t`, its label above the line at
    /// the right end (the i-th marker's label further left).
    fn horizontal_marker(&self, out: &mut String, label: &str, t: f64, i: usize) {
        let y = self.py(t);
        let label_y = if y - 4.0 < self.top + 10.0 { y + 12.0 } else { y - 4.0 };
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#222" stroke-width="1.2" stroke-dasharray="5 3"/><text x="{:.1}" y="{label_y:.1}" text-anchor="end" {HALO}>{}</text>"##,
            self.left,
            self.right,
            self.right - 4.0 - i as f64 * 120.0,
            html_escape(label)
        );
    }
}

/// How far `t` lies along `range`, 0 at its start and 1 at its end; in
/// halves, so that a range from -f64::MAX to f64::MAX does not overflow.
fn fraction(t: f64, range: (f64, f64)) -> f64 {
    (t / 2.0 - range.0 / 2.0) / (range.1 / 2.0 - range.0 / 2.0)
}

/// Text drawn over data: a white outline keeps it legible.
const HALO: &str = r##"stroke="#fff" stroke-width="3" stroke-linejoin="round" paint-order="stroke""##;

/// Estimated width in px of `s` in a sans-serif font of `size` px.
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.58
}

impl Chart<'_> {
    /// The whole SVG: frame, title, legend, grid and tick labels, then
    /// `draw` for the data, then axis lines, labels and the caption.
    fn render(&self, draw: impl FnOnce(&Frame, &mut String)) -> String {
        let (width, height) = (self.width.max(200) as f64, self.height.max(150) as f64);
        let widest_y_label = self.y.ticks.iter().map(|(_, l)| text_width(l, TICK_FONT)).fold(0.0, f64::max);
        let widest_x_label = self.x.ticks.iter().map(|(_, l)| text_width(l, TICK_FONT)).fold(0.0, f64::max);
        let left = 34.0 + widest_y_label;
        // Room for half of the last x tick label, centred on the right edge.
        let right = width - (widest_x_label / 2.0 + 4.0).max(16.0);

        let mut legend_at = Vec::with_capacity(self.legend.len());
        let (mut x, mut row) = (left, 0);
        for (name, _) in &self.legend {
            let item = 14.0 + 5.0 + text_width(name, LEGEND_FONT) + 16.0;
            if x + item > right && x > left {
                row += 1;
                x = left;
            }
            legend_at.push((x, 40.0 + row as f64 * 16.0));
            x += item;
        }
        let legend_rows = if self.legend.is_empty() { 0 } else { row + 1 };
        let top = 34.0 + legend_rows as f64 * 16.0 + 6.0;

        let column = (right - left) / self.categories.len().max(1) as f64;
        let category_lines: Vec<Vec<String>> = self
            .categories
            .iter()
            .map(|(label, count)| {
                let mut lines = wrap(label, (column / (TICK_FONT * 0.58)) as usize);
                lines.push(count.clone());
                lines
            })
            .collect();
        let label_rows = category_lines.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let x_label_room = if self.x_label.is_empty() { 4.0 } else { 20.0 };
        let bottom = height - (label_rows as f64 * LINE + 6.0 + x_label_room);
        let caption: Vec<String> = self.notes.iter().flat_map(|n| wrap(n, ((width - 24.0) / (CAPTION_FONT * 0.55)) as usize)).collect();
        let total_height = height + caption.len() as f64 * LINE + if caption.is_empty() { 0.0 } else { 6.0 };

        let frame = Frame { left, top, right, bottom, x: (self.x.lo, self.x.hi), y: (self.y.lo, self.y.hi) };
        let title = html_escape(self.title);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{total_height:.0}" viewBox="0 0 {width:.0} {total_height:.0}" font-family="Helvetica, Arial, sans-serif" font-size="{TICK_FONT}" role="img" aria-label="{title}">"##
        );
        let _ = writeln!(out, "<title>{title}</title>");
        let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="#fff"/>"##);
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="20" text-anchor="middle" font-size="14" font-weight="bold" fill="#111">{title}</text>"##,
            width / 2.0
        );
        for ((name, colour), (x, y)) in self.legend.iter().zip(&legend_at) {
            let mark = match self.swatch {
                Swatch::Area => format!(
                    r#"<rect x="{x:.1}" y="{:.1}" width="14" height="10" fill="{colour}" fill-opacity="0.18" stroke="{colour}" stroke-width="1.5"/>"#,
                    y - 9.0
                ),
                Swatch::Dot => format!(r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"#, x + 7.0, y - 4.0),
            };
            let _ = writeln!(
                out,
                r##"{mark}<text x="{:.1}" y="{y:.1}" font-size="{LEGEND_FONT}" fill="#222">{}</text>"##,
                x + 19.0,
                html_escape(name)
            );
        }

        // Grid under the data.
        let mut grid = String::new();
        for (t, _) in &self.y.ticks {
            let _ = write!(grid, "M{left:.1},{:.1}H{right:.1}", frame.py(*t));
        }
        for (t, _) in &self.x.ticks {
            let _ = write!(grid, "M{:.1},{top:.1}V{bottom:.1}", frame.px(*t));
        }
        if !grid.is_empty() {
            let _ = writeln!(out, r##"<path d="{grid}" stroke="#e6e6e6" stroke-width="1" fill="none"/>"##);
        }

        draw(&frame, &mut out);

        let _ = writeln!(out, r##"<path d="M{left:.1},{top:.1}V{bottom:.1}H{right:.1}" stroke="#333" stroke-width="1" fill="none"/>"##);
        let mut marks = String::new();
        for (t, _) in &self.y.ticks {
            let _ = write!(marks, "M{:.1},{:.1}h5", left - 5.0, frame.py(*t));
        }
        for t in &self.y.minor {
            let _ = write!(marks, "M{:.1},{:.1}h3", left - 3.0, frame.py(*t));
        }
        for (t, _) in &self.x.ticks {
            let _ = write!(marks, "M{:.1},{bottom:.1}v5", frame.px(*t));
        }
        for t in &self.x.minor {
            let _ = write!(marks, "M{:.1},{bottom:.1}v3", frame.px(*t));
        }
        if !marks.is_empty() {
            let _ = writeln!(out, r##"<path d="{marks}" stroke="#333" stroke-width="1" fill="none"/>"##);
        }
        for (t, label) in &self.y.ticks {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">{}</text>"##,
                left - 7.0,
                frame.py(*t) + 3.5,
                html_escape(label)
            );
        }
        // Label every k-th x tick, k as small as keeps labels from touching.
        let spacing = (right - left) / self.x.ticks.len().saturating_sub(1).max(1) as f64;
        let every = ((widest_x_label + 8.0) / spacing).ceil().max(1.0) as usize;
        for (t, label) in self.x.ticks.iter().step_by(every) {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
                frame.px(*t),
                bottom + 15.0,
                html_escape(label)
            );
        }
        for (i, lines) in category_lines.iter().enumerate() {
            let cx = frame.px(i as f64 + 0.5);
            for (j, line) in lines.iter().enumerate() {
                let colour = if j + 1 == lines.len() { "#666" } else { "#222" };
                let _ = writeln!(
                    out,
                    r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="{colour}">{}</text>"#,
                    bottom + 15.0 + j as f64 * LINE,
                    html_escape(line)
                );
            }
        }
        if !self.x_label.is_empty() {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#111">{}</text>"##,
                (left + right) / 2.0,
                height - 8.0,
                html_escape(self.x_label)
            );
        }
        if !self.y_label.is_empty() {
            let _ = writeln!(
                out,
                r##"<text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle" font-size="12" fill="#111">{}</text>"##,
                (top + bottom) / 2.0,
                html_escape(self.y_label)
            );
        }
        for (i, line) in caption.iter().enumerate() {
            let _ = writeln!(
                out,
                r##"<text x="12" y="{:.1}" font-size="{CAPTION_FONT}" fill="#444">{}</text>"##,
                height + 4.0 + (i + 1) as f64 * LINE - 3.0,
                html_escape(line)
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

/// Words of `text` in lines of at most `max_chars` characters (a longer
/// word gets a line of its own).
fn wrap(text: &str, max_chars: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > max_chars.max(1) {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// 1234567 as "1,234,567".
fn group_digits(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn quoted(name: &str) -> String {
    format!("\u{201c}{name}\u{201d}")
}

/// A value for a tooltip: four significant digits.
fn sci(v: f64) -> String {
    format!("{v:.3e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: synthetic data without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn uniform(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Box–Muller.
        fn normal(&mut self) -> f64 {
            let u = 1.0 - self.uniform();
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
        }

        /// |errors| whose log10 is normal: centred on `median`, `decades` wide (one sigma).
        fn log_normal(&mut self, n: usize, median: f64, decades: f64) -> Vec<f64> {
            (0..n).map(|_| 10f64.powf(median.log10() + decades * self.normal())).collect()
        }
    }

    /// Tags nest and close, the document is one <svg> element, and every
    /// '&' starts an entity this module writes.
    fn assert_well_formed(svg: &str) {
        assert!(svg.starts_with("<svg "), "does not open with <svg: {}", &svg[..svg.len().min(40)]);
        assert!(svg.trim_end().ends_with("</svg>"), "does not end with </svg>");
        assert_eq!(svg.matches("<svg").count(), 1);
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            assert!(!rest[..start].contains('>'), "a raw '>' in text: {:?}", &rest[..start]);
            let end = start + rest[start..].find('>').expect("a tag is never closed");
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
            assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes: {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "</{name}> closes the wrong element");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap());
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "never closed: {open:?}");
        for (i, _) in svg.match_indices('&') {
            let entity = ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].iter().any(|e| svg[i..].starts_with(e));
            assert!(entity, "a raw '&': {:?}", &svg[i..svg.len().min(i + 20)]);
        }
    }

    fn attribute_values<'a>(svg: &'a str, name: &str) -> Vec<&'a str> {
        let key = format!(" {name}=\"");
        svg.match_indices(&key)
            .map(|(i, _)| {
                let value = &svg[i + key.len()..];
                &value[..value.find('"').unwrap()]
            })
            .collect()
    }

    /// Every coordinate the SVG holds is a finite number.
    fn assert_finite_coordinates(svg: &str) {
        for name in ["x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "r", "width", "height"] {
            for value in attribute_values(svg, name) {
                if value == "100%" {
                    continue;
                }
                let v: f64 = value.parse().unwrap_or_else(|_| panic!("{name}=\"{value}\" is not a number"));
                assert!(v.is_finite(), "{name}=\"{value}\"");
            }
        }
        for name in ["d", "transform", "viewBox"] {
            for value in attribute_values(svg, name) {
                let lower = value.to_lowercase();
                assert!(!lower.contains("nan") && !lower.contains("inf"), "{name}=\"{value}\"");
                if name == "d" {
                    for token in value.split(|c: char| c.is_ascii_alphabetic() || c == ',' || c == ' ').filter(|t| !t.is_empty()) {
                        let v: f64 = token.parse().unwrap_or_else(|_| panic!("d holds {token:?}"));
                        assert!(v.is_finite());
                    }
                }
            }
        }
    }

    fn assert_sound(svg: &str) {
        assert_well_formed(svg);
        assert_finite_coordinates(svg);
    }

    fn series(name: &str, values: Vec<f64>) -> Series {
        Series { name: name.to_string(), values }
    }

    /// 1, 2 or 5 x 10^k, to within the rounding of a difference of ticks.
    fn is_nice(step: f64) -> bool {
        let mantissa = step / 10f64.powf(step.log10().floor());
        [1.0, 2.0, 5.0, 10.0].iter().any(|m| (mantissa - m).abs() < 1e-3)
    }

    #[test]
    fn text_is_escaped_and_svgs_are_well_formed() {
        let title = r#"errors of <fused> & "ref" 'x'"#;
        let mut rng = Rng(1);
        let hist = histogram_svg(
            title,
            "|error| <x>",
            &[series("a<b", rng.log_normal(500, 1e-7, 0.5)), series("c&d", rng.log_normal(500, 1e-6, 0.5))],
            HistOptions { log_x: true, markers: vec![("bound <2>".into(), 1e-5)], ..Default::default() },
        );
        let points: Vec<(f64, f64)> = (0..300).map(|i| (i as f64, rng.uniform())).collect();
        let scatter = scatter_svg(
            title,
            "token <i>",
            "err & bound",
            &[PointSeries { name: "p\"q".into(), points }],
            ScatterOptions { markers: vec![("bound's".into(), 0.5)], ..Default::default() },
        );
        let strip = strip_svg(title, "err", &[("A<0 & clipped".into(), vec![1.0, 2.0, 3.0])], StripOptions::default());
        for svg in [&hist, &scatter, &strip] {
            assert_sound(svg);
            assert!(svg.contains("errors of &lt;fused&gt; &amp; &quot;ref&quot; &#39;x&#39;"), "{svg}");
            assert!(!svg.contains("<fused>"));
        }
        assert!(hist.contains("a&lt;b") && hist.contains("c&amp;d") && hist.contains("bound &lt;2&gt;"));
        assert!(scatter.contains("p&quot;q") && scatter.contains("token &lt;i&gt;") && scatter.contains("bound&#39;s"));
        assert!(strip.contains("A&lt;0 &amp;"));
    }

    #[test]
    fn values_that_cannot_be_placed_are_counted_in_the_caption() {
        let mut values = vec![0.0, -0.0, 0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-3];
        values.extend(Rng(2).log_normal(100, 1e-6, 1.0));
        let hist = histogram_svg("h", "x", &[series("fused", values.clone())], HistOptions { log_x: true, ..Default::default() });
        assert_sound(&hist);
        assert!(hist.contains("Not shown: 3 exact zeros, 1 negative value, 1 NaN, 1 +inf, 1 -inf."), "{hist}");
        assert_eq!(Histogram::count(&[series("fused", values.clone())], 40, true).counts[0].iter().sum::<u64>(), 100);

        // On a linear axis zeros and negatives are ordinary values.
        let linear = histogram_svg("h", "x", &[series("fused", values.clone()), series("ref", vec![1.0])], HistOptions::default());
        assert_sound(&linear);
        assert!(linear.contains("Not shown: 1 NaN, 1 +inf, 1 -inf in “fused”."), "{linear}");

        let points: Vec<(f64, f64)> = values.iter().enumerate().map(|(i, &v)| (i as f64 + 1.0, v)).collect();
        let mut with_bad_x = points.clone();
        with_bad_x.push((f64::NAN, 1.0));
        let scatter = scatter_svg(
            "s",
            "x",
            "y",
            &[PointSeries { name: "fused".into(), points: with_bad_x }],
            ScatterOptions { log_y: true, ..Default::default() },
        );
        assert_sound(&scatter);
        assert!(
            scatter.contains("Not shown: 8 points (x: 1 NaN; y: 3 exact zeros, 1 negative value, 1 NaN, 1 +inf, 1 -inf)."),
            "{scatter}"
        );

        // The ends of the f64 range draw, if not well, then without NaN or inf.
        let huge = vec![f64::MAX, -f64::MAX, 0.0];
        assert_sound(&histogram_svg("h", "x", &[series("huge", huge.clone())], HistOptions::default()));
        let points = vec![(f64::MAX, -f64::MAX), (-f64::MAX, f64::MAX)];
        assert_sound(&scatter_svg("s", "x", "y", &[PointSeries { name: "huge".into(), points }], ScatterOptions::default()));
        assert_sound(&strip_svg("s", "y", &[("huge".into(), huge)], StripOptions::default()));

        let strip = strip_svg("s", "y", &[("at a kink".into(), values)], StripOptions { log_y: true, ..Default::default() });
        assert_sound(&strip);
        assert!(strip.contains("Not shown: 3 exact zeros, 1 negative value, 1 NaN, 1 +inf, 1 -inf."), "{strip}");
        assert!(strip.contains("n=107"));
    }

    #[test]
    fn histogram_counts_every_placeable_value_once() {
        let mut rng = Rng(3);
        for log in [false, true] {
            for bins in [1, 7, 40, 200] {
                let mut a = rng.log_normal(10_000, 3e-7, 1.5);
                a.extend([0.0, f64::NAN, -2.0, 1e-300, 1e300, f64::MIN_POSITIVE]);
                let b: Vec<f64> = (0..5_000).map(|_| rng.normal() * 1e-3).collect();
                let all = [series("a", a), series("b", b)];
                let hist = Histogram::count(&all, bins, log);
                assert!(is_nice(hist.width), "bin width {}", hist.width);
                for (s, (counts, ex)) in all.iter().zip(hist.counts.iter().zip(&hist.excluded)) {
                    let placeable = s.values.iter().filter(|&&v| place(v, log).is_some()).count();
                    assert_eq!(counts.iter().sum::<u64>() as usize, placeable, "log={log} bins={bins}");
                    assert_eq!(placeable + ex.total(), s.values.len());
                    // Each value is counted in the bin whose edges hold it (by search over the edges).
                    let inner_edges: Vec<f64> = (1..counts.len()).map(|i| hist.edge(i)).collect();
                    let mut expected = vec![0u64; counts.len()];
                    for t in s.values.iter().filter_map(|&v| place(v, log)) {
                        assert!(hist.edge(0) <= t && t < hist.end().unwrap(), "{t} outside the bins");
                        expected[inner_edges.partition_point(|&e| e <= t)] += 1;
                    }
                    assert_eq!(counts, &expected, "log={log} bins={bins}");
                }
            }
        }
    }

    #[test]
    fn a_single_repeated_value_fills_one_bin() {
        for log in [false, true] {
            let values = vec![2.5e-7; 1000];
            let hist = Histogram::count(&[series("same", values.clone())], 40, log);
            let full: Vec<u64> = hist.counts[0].iter().copied().filter(|&c| c > 0).collect();
            assert_eq!(full, vec![1000]);
            assert_sound(&histogram_svg("same", "x", &[series("same", values)], HistOptions { log_x: log, ..Default::default() }));
        }
        assert_sound(&strip_svg("s", "y", &[("one".into(), vec![0.0; 5])], StripOptions::default()));
        let points = vec![(1.0, 1.0); 10];
        assert_sound(&scatter_svg("s", "x", "y", &[PointSeries { name: "p".into(), points }], ScatterOptions::default()));
    }

    fn labels(axis: &Axis) -> Vec<&str> {
        axis.ticks.iter().map(|(_, l)| l.as_str()).collect()
    }

    #[test]
    fn linear_ticks_are_round_numbers() {
        assert_eq!(labels(&linear_axis(0.0, 1.0, 5)), ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        assert_eq!(labels(&linear_axis(-5.0, -1.0, 5)), ["-5", "-4", "-3", "-2", "-1"]);
        assert_eq!(labels(&linear_axis(-0.3, 0.7, 5)), ["-0.4", "-0.2", "0", "0.2", "0.4", "0.6", "0.8"]);
        assert_eq!(labels(&linear_axis(0.0, 1e6, 5)), ["0", "200000", "400000", "600000", "800000", "1000000"]);
        assert_eq!(labels(&linear_axis(0.0, 3e7, 5)), ["0", "5.0e6", "1.0e7", "1.5e7", "2.0e7", "2.5e7", "3.0e7"]);
        assert_eq!(labels(&linear_axis(1e-9, 3e-9, 5)), ["1.0e-9", "1.5e-9", "2.0e-9", "2.5e-9", "3.0e-9"]);
        assert_eq!(labels(&linear_axis(3.0, 3.0, 5)), ["2.7", "2.8", "2.9", "3.0", "3.1", "3.2", "3.3"]);
        assert_eq!(labels(&linear_axis(0.0, 0.0, 5)), ["-1.0", "-0.5", "0", "0.5", "1.0"]);

        let ranges = [
            (0.0, 1.0),
            (0.0, 7.0),
            (0.0, 3e7),
            (-5.0, -1.0),
            (-0.3, 0.7),
            (1e-9, 3e-9),
            (-4e-12, -1e-12),
            (1.0, 1.0 + 1e-11),
            (123_456_789.0, 123_456_790.0),
            (3.0, 3.0),
            (0.0, 0.0),
            (-2e-7, -2e-7),
            (1e-320, 1e-320),
            (-1e300, 1e300),
        ];
        for (lo, hi) in ranges {
            let axis = linear_axis(lo, hi, 5);
            let values: Vec<f64> = axis.ticks.iter().map(|(v, _)| *v).collect();
            let step = values[1] - values[0];
            assert!(is_nice(step) || lo == 1e-320, "[{lo}, {hi}]: step {step}");
            assert!(axis.lo <= lo && axis.hi >= hi, "[{lo}, {hi}] not covered by [{}, {}]", axis.lo, axis.hi);
            assert!(axis.lo < axis.hi);
            assert!((3..=12).contains(&values.len()), "[{lo}, {hi}]: {} ticks", values.len());
            let names = labels(&axis);
            for pair in names.windows(2) {
                assert_ne!(pair[0], pair[1], "[{lo}, {hi}]: repeated label in {names:?}");
            }
            for (v, label) in &axis.ticks {
                let read: f64 = label.parse().unwrap_or_else(|_| panic!("label {label:?}"));
                assert!((read - v).abs() <= step.abs() * 1e-3, "[{lo}, {hi}]: {label} for {v}");
                if *v == 0.0 {
                    assert_eq!(label, "0", "[{lo}, {hi}]");
                }
            }
        }
    }

    #[test]
    fn log_ticks_are_decades() {
        let axis = log_axis(-8.3, -2.1);
        assert_eq!(labels(&axis), ["1e-9", "1e-8", "1e-7", "1e-6", "1e-5", "1e-4", "1e-3", "1e-2"]);
        assert_eq!((axis.lo, axis.hi), (-9.0, -2.0));
        assert!(axis.minor.is_empty(), "8 decades are too many for minor ticks");

        let few = log_axis(-7.5, -6.2);
        assert_eq!(labels(&few), ["1e-8", "1e-7", "1e-6"]);
        assert_eq!(few.minor.len(), 16);

        // One value on a decade: the decades either side.
        assert_eq!(labels(&log_axis(-7.0, -7.0)), ["1e-8", "1e-7", "1e-6"]);
        assert_eq!(labels(&log_axis((1e-7f64).log10(), (1e-5f64).log10())), ["1e-7", "1e-6", "1e-5"]);

        // Forty decades: labelled every five, the others minor.
        let wide = log_axis(-38.2, 1.5);
        assert_eq!(labels(&wide), ["1e-40", "1e-35", "1e-30", "1e-25", "1e-20", "1e-15", "1e-10", "1e-5", "1e0", "1e5"]);
        assert!(wide.ticks.len() <= 10);

        // Counts read as plain numbers.
        assert_eq!(labels(&log_axis(0.0, 6.0)), ["1", "10", "100", "1000", "10000", "100000", "1000000"]);
    }

    #[test]
    fn downsampling_bounds_the_count_and_keeps_what_matters() {
        let mut rng = Rng(4);
        let points: Vec<(f64, f64)> = (0..100_000).map(|_| (rng.normal(), rng.uniform().powi(3))).collect();
        let kept = downsample(&points, 500);
        assert_eq!(kept.len(), 500);
        assert_eq!(kept, downsample(&points, 500), "not deterministic");
        let extreme = |key: fn(&(f64, f64)) -> f64, greatest: bool| {
            *points.iter().max_by(|a, b| if greatest { key(a).total_cmp(&key(b)) } else { key(b).total_cmp(&key(a)) }).unwrap()
        };
        for p in [extreme(|p| p.0, false), extreme(|p| p.0, true), extreme(|p| p.1, false), extreme(|p| p.1, true)] {
            assert!(kept.contains(&p), "{p:?} thinned away");
        }
        let mut by_y = points.clone();
        by_y.sort_by(|a, b| b.1.total_cmp(&a.1));
        for p in &by_y[..50] {
            assert!(kept.contains(p), "one of the 50 largest y thinned away: {p:?}");
        }
        // Input order is kept (a subsequence of the input).
        let mut at = points.iter();
        assert!(kept.iter().all(|k| at.any(|p| p == k)));

        for max in [0, 1, 3, 4, 5, 17] {
            assert_eq!(downsample(&points, max).len(), max);
        }
        assert_eq!(downsample(&points[..10], 10), points[..10].to_vec());
        assert!(downsample(&[], 5).is_empty());
    }

    #[test]
    fn spread_quartiles() {
        let s = Spread::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!((s.min, s.q1, s.median, s.q3, s.max), (1.0, 2.0, 3.0, 4.0, 5.0));
        let s = Spread::of(&[1.0, 2.0]).unwrap();
        assert_eq!((s.q1, s.median, s.q3), (1.25, 1.5, 1.75));
        let s = Spread::of(&[7.0]).unwrap();
        assert_eq!((s.min, s.q1, s.median, s.q3, s.max), (7.0, 7.0, 7.0, 7.0, 7.0));
        assert_eq!(Spread::of(&[]), None);
        let s = Spread::of(&[-1e308, 1e308]).unwrap();
        assert_eq!(s.median, 0.0);
        let ranks: Vec<f64> = spaced_ranks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 3).collect();
        assert_eq!(ranks, [1.0, 4.0, 7.0]);
    }

    #[test]
    fn empty_inputs_draw_an_empty_plot() {
        let cases = [
            histogram_svg("h", "x", &[], HistOptions::default()),
            histogram_svg("h", "x", &[series("none", vec![])], HistOptions { log_x: true, log_count: true, ..Default::default() }),
            histogram_svg("h", "x", &[series("nan", vec![f64::NAN; 4])], HistOptions::default()),
            histogram_svg("h", "x", &[], HistOptions { markers: vec![("bound".into(), 3.0)], ..Default::default() }),
            scatter_svg("s", "x", "y", &[], ScatterOptions::default()),
            scatter_svg("s", "x", "y", &[PointSeries::default()], ScatterOptions { log_x: true, log_y: true, ..Default::default() }),
            strip_svg("s", "y", &[], StripOptions::default()),
            strip_svg("s", "y", &[("empty".into(), vec![])], StripOptions { log_y: true, ..Default::default() }),
        ];
        for svg in &cases {
            assert_sound(svg);
        }
        assert!(cases[0].contains("no values to show") && cases[2].contains("Not shown: 4 NaN."));
        assert!(cases[4].contains("no points to show"));
        assert!(cases[7].contains("no tokens") && cases[7].contains("n=0"));
        let mixed = strip_svg(
            "s",
            "y",
            &[("unclipped, A&gt;0".into(), vec![1e-7, 2e-7]), ("clipped high, A<0".into(), vec![]), ("zeros".into(), vec![0.0])],
            StripOptions { log_y: true, ..Default::default() },
        );
        assert_sound(&mixed);
        assert!(mixed.contains("no tokens") && mixed.contains("none shown"));
    }

    #[test]
    fn a_million_values_make_a_small_file() {
        let mut rng = Rng(5);
        let errors = rng.log_normal(1_000_000, 1e-7, 0.8);
        let all = [series("a", errors.clone()), series("b", errors.iter().map(|e| e * 3.0).collect())];
        let started = std::time::Instant::now();
        let hist = histogram_svg("h", "x", &all, HistOptions { log_x: true, log_count: true, ..Default::default() });
        eprintln!("histogram of 2e6 values: {:?}, {} bytes", started.elapsed(), hist.len());
        assert_sound(&hist);
        assert!(hist.len() < 20_000, "{} bytes", hist.len());

        let points: Vec<(f64, f64)> = errors.iter().enumerate().map(|(i, &e)| (i as f64, e)).collect();
        let started = std::time::Instant::now();
        let scatter = scatter_svg(
            "s",
            "token",
            "err",
            &[PointSeries { name: "a".into(), points }],
            ScatterOptions { log_y: true, ..Default::default() },
        );
        eprintln!("scatter of 1e6 points: {:?}, {} bytes", started.elapsed(), scatter.len());
        assert_sound(&scatter);
        assert_eq!(scatter.matches("h0.1").count(), 2000);
        assert!(scatter.contains("“a”: 2,000 of 1,000,000"));
        assert!(scatter.len() < 40_000, "{} bytes", scatter.len());

        let strip = strip_svg("s", "err", &[("all".into(), errors)], StripOptions { log_y: true, ..Default::default() });
        assert_sound(&strip);
        assert!(strip.len() < 10_000, "{} bytes", strip.len());
    }

    #[test]
    fn markers_widen_the_axis_or_are_explained() {
        let values = vec![1e-7, 2e-7, 3e-7];
        let svg = histogram_svg(
            "h",
            "x",
            &[series("a", values.clone())],
            HistOptions { log_x: true, markers: vec![("bound".into(), 1e-4), ("zero".into(), 0.0)], ..Default::default() },
        );
        assert_sound(&svg);
        assert!(svg.contains(">1e-4<"), "the axis does not reach the bound");
        assert!(svg.contains("Reference line “zero” at 0 is not drawn"));
        let strip =
            strip_svg("s", "y", &[("g".into(), values)], StripOptions { markers: vec![("bound".into(), 10.0)], ..Default::default() });
        assert!(strip.contains(">10<") || strip.contains(">10.0<"), "{strip}");
    }

    #[test]
    fn html_escapes_text_and_tables() {
        assert_eq!(html_escape(r#"<a href="x">&'"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        let table =
            html_table(&["impl", "err <max>"], &[vec!["fused & co".into(), "1.5e-7".into()], vec!["<script>".into(), "n/a".into()]]);
        assert!(table.contains("<th>err &lt;max&gt;</th>"));
        assert!(table.contains("<td>fused &amp; co</td><td class=\"num\">1.5e-7</td>"));
        assert!(table.contains("<td>&lt;script&gt;</td><td>n/a</td>"));
        assert!(!table.contains("<script>"));
        assert_eq!(table.matches("<tr>").count(), 3);

        let sections: Vec<Section> =
            (0..3).map(|i| Section { heading: format!("part {i} <&>"), html: format!("<p>body {i}</p>") }).collect();
        let page = html_page("gradcheck <run>", &sections);
        assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
        assert!(page.contains("<title>gradcheck &lt;run&gt;</title>") && page.contains("<h2>part 2 &lt;&amp;&gt;</h2>"));
        assert!(page.contains("<p>body 1</p>") && page.contains("href=\"#section-3\""));
        assert!(!page.contains("http://") && !page.contains("https://") && !page.contains("<script"));
        assert!(!html_page("one", &sections[..1]).contains("<nav>"));
    }

    /// A page of every plot over synthetic log-normal errors of three
    /// implementations. Set GRPO_PLOTS_SAMPLE=path to write it out and look.
    #[test]
    fn sample_page() {
        let mut rng = Rng(6);
        let n = 200_000;
        let mut fused = rng.log_normal(n, 6e-8, 0.45);
        fused[..1500].iter_mut().for_each(|e| *e = 0.0);
        let all = [
            series("reference (f32)", rng.log_normal(n, 3e-8, 0.4)),
            series("fused", fused),
            series("chunked bf16", rng.log_normal(n, 2e-6, 0.5)),
        ];
        let bound = 4e-5;
        let hist = histogram_svg(
            "|grad error| per token, against the f64 oracle",
            "|error| (scaled)",
            &all,
            HistOptions { log_x: true, markers: vec![(format!("bound {bound:.0e}"), bound)], ..Default::default() },
        );
        let hist_log = histogram_svg(
            "The same, counts on a log axis (tails)",
            "|error| (scaled)",
            &all,
            HistOptions { log_x: true, log_count: true, markers: vec![(format!("bound {bound:.0e}"), bound)], ..Default::default() },
        );
        let scatter_series: Vec<PointSeries> = all
            .iter()
            .map(|s| PointSeries { name: s.name.clone(), points: s.values.iter().enumerate().map(|(i, &e)| ((i + 1) as f64, e)).collect() })
            .collect();
        let scatter = scatter_svg(
            "|grad error| by token",
            "token index",
            "|error|",
            &scatter_series,
            ScatterOptions { log_y: true, markers: vec![("bound".into(), bound)], ..Default::default() },
        );
        let groups: Vec<(String, Vec<f64>)> = [
            ("unclipped, A>0", 5e-8f64, 4000),
            ("unclipped, A<0", 6e-8, 3500),
            ("clipped high, A>0", 1e-7, 300),
            ("clipped low, A<0", 2e-7, 120),
            ("at a kink", 3e-6, 7),
            ("masked", 0.0, 0),
        ]
        .iter()
        .map(|&(name, median, count)| (name.to_string(), rng.log_normal(count, median.max(1e-30), 0.5)))
        .collect();
        let strip = strip_svg(
            "fused: |grad error| by clip region",
            "|error|",
            &groups,
            StripOptions { log_y: true, markers: vec![("bound".into(), bound)], ..Default::default() },
        );
        for svg in [&hist, &hist_log, &scatter, &strip] {
            assert_sound(svg);
        }
        let table = html_table(
            &["implementation", "max |error|", "bound"],
            &all.iter()
                .map(|s| vec![s.name.clone(), format!("{:.3e}", s.values.iter().copied().fold(0.0, f64::max)), format!("{bound:.1e}")])
                .collect::<Vec<_>>(),
        );
        let page = html_page(
            "gradcheck: sample report",
            &[
                Section { heading: "Worst errors".into(), html: table },
                Section { heading: "Error histogram".into(), html: hist },
                Section { heading: "Error histogram, log counts".into(), html: hist_log },
                Section { heading: "Errors by token".into(), html: scatter },
                Section { heading: "Errors by clip region".into(), html: strip },
            ],
        );
        assert!(page.len() < 200_000, "{} bytes", page.len());
        if let Some(path) = std::env::var_os("GRPO_PLOTS_SAMPLE") {
            std::fs::write(&path, &page).unwrap();
        }
    }
}
