//! SVG figures (plotters): a white canvas split into panels side by side ([`Svg`]), charts
//! laid out alike ([`chart`]), and the series every figure draws: a labelled line with its
//! points ([`line()`], [`points()`]) and the legend ([`legend`]). It draws what it is given; which
//! figures a benchmark draws, and from which rows, is the benchmark's business.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One panel of an [`Svg`].
pub type Panel<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A chart on a panel, over coordinates `X` × `Y` (linear or log f64 ranges).
pub type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// An SVG file being drawn; [`Svg::finish`] writes it.
pub struct Svg<'a> {
    root: Panel<'a>,
}

impl std::fmt::Debug for Svg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Svg")
            .field("size", &self.root.dim_in_pixel())
            .finish_non_exhaustive()
    }
}

impl<'a> Svg<'a> {
    /// A white canvas of `size` pixels, to be written to `path`.
    pub fn create(path: &'a Path, size: (u32, u32)) -> anyhow::Result<Svg<'a>> {
        let root = SVGBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE)?;
        Ok(Svg { root })
    }

    /// The canvas split into `n` panels side by side.
    pub fn panels(&self, n: usize) -> Vec<Panel<'a>> {
        self.root.split_evenly((1, n))
    }

    /// Writes the file.
    pub fn finish(self) -> anyhow::Result<()> {
        self.root.present()?;
        Ok(())
    }
}

/// A chart builder on `panel` with the figures' layout: `caption` at `font` points, a
/// 12-pixel margin, room for the axes' labels.
pub fn chart<'a, 'b>(
    panel: &'a Panel<'b>,
    caption: &str,
    font: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(panel);
    builder
        .caption(caption, ("sans-serif", font))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64);
    builder
}

/// A line through `points` in `color`, two pixels wide, with a legend entry `label`.
pub fn line<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    points: &[(f64, f64)],
    color: impl Color + Copy + 'static,
    label: &str,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(points.to_vec(), color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    Ok(())
}

/// A filled dot of `color` at each of `points`.
pub fn points<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    points: &[(f64, f64)],
    color: impl Color + Copy,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    Ok(())
}

/// [`line()`] and its [`points()`].
pub fn line_with_points<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    series: &[(f64, f64)],
    color: impl Color + Copy + 'static,
    label: &str,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    line(chart, series, color, label)?;
    points(chart, series, color)
}

/// The legend of the labelled series, boxed, at `position`.
pub fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(position)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_panels_with_labelled_lines() {
        let path = std::env::temp_dir().join(format!("netless-plot-{}.svg", std::process::id()));
        let svg = Svg::create(&path, (600, 300)).unwrap();
        for (i, panel) in svg.panels(2).iter().enumerate() {
            let mut c = chart(panel, &format!("panel {i}"), 16)
                .build_cartesian_2d(0f64..3.0, (1f64..100.0).log_scale())
                .unwrap();
            c.configure_mesh().draw().unwrap();
            line_with_points(&mut c, &[(1.0, 2.0), (2.0, 50.0)], BLUE, "by ref").unwrap();
            legend(&mut c, SeriesLabelPosition::UpperLeft).unwrap();
        }
        svg.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(text.starts_with("<svg") && text.contains("by ref") && text.contains("panel 1"));
    }
}
