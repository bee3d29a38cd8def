//! The pictures the client sends, made at start-up (nothing is downloaded): per size, a
//! scene of gradients, shapes and grain, encoded once as a JPEG and once, with other
//! shapes, as a PNG, so ingest receives real files of both kinds. The same seed gives the
//! same pictures in every process.

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder as _, Rgb, RgbImage};
use serde::Serialize;

use crate::proto::images::Format;

/// One picture as the client sends it.
#[derive(Clone, Debug)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub format: Format,
    pub encoded: Vec<u8>,
}

/// What the report says about a picture.
#[derive(Serialize, Clone, Debug)]
pub struct PictureInfo {
    pub width: u32,
    pub height: u32,
    pub format: String,
    pub bytes: usize,
}

impl Picture {
    pub fn info(&self) -> PictureInfo {
        PictureInfo {
            width: self.width,
            height: self.height,
            format: self.format.as_str_name().to_lowercase(),
            bytes: self.encoded.len(),
        }
    }
}

/// JPEG quality of the pictures sent (a camera's).
const CAMERA_QUALITY: u8 = 90;

/// Two pictures (JPEG, PNG) per `(width, height)`.
pub fn generate(sizes: &[(u32, u32)]) -> Result<Vec<Picture>, String> {
    let mut out = Vec::new();
    for (i, &(width, height)) in sizes.iter().enumerate() {
        for format in [Format::Jpeg, Format::Png] {
            let seed = 0x9e37_79b9 ^ (i as u64) << 8 ^ format as u64;
            let scene = scene(width, height, seed);
            let mut encoded = Vec::new();
            let result = match format {
                Format::Png => PngEncoder::new(&mut encoded).write_image(
                    scene.as_raw(),
                    width,
                    height,
                    ExtendedColorType::Rgb8,
                ),
                _ => JpegEncoder::new_with_quality(&mut encoded, CAMERA_QUALITY).encode(
                    scene.as_raw(),
                    width,
                    height,
                    ExtendedColorType::Rgb8,
                ),
            };
            result.map_err(|e| format!("encoding a {width}x{height} picture: {e}"))?;
            out.push(Picture {
                width,
                height,
                format,
                encoded,
            });
        }
    }
    Ok(out)
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n.max(1))) as u32
    }
}

/// A sky-to-ground gradient, a dozen discs and rectangles of random colours, and grain.
fn scene(width: u32, height: u32, seed: u64) -> RgbImage {
    let mut rng = Rng(seed | 1);
    let mut img = RgbImage::from_fn(width, height, |x, y| {
        let fy = y as f32 / height.max(1) as f32;
        let fx = x as f32 / width.max(1) as f32;
        Rgb([
            (40.0 + 150.0 * fy + 30.0 * fx) as u8,
            (90.0 + 100.0 * (1.0 - fy)) as u8,
            (200.0 - 140.0 * fy + 20.0 * fx) as u8,
        ])
    });
    for _ in 0..12 {
        let color = Rgb([
            rng.below(256) as u8,
            rng.below(256) as u8,
            rng.below(256) as u8,
        ]);
        let (cx, cy) = (rng.below(width), rng.below(height));
        let r = 8 + rng.below(width.min(height) / 5 + 1);
        let disc = rng.below(2) == 0;
        let (x0, x1) = (cx.saturating_sub(r), (cx + r).min(width));
        let (y0, y1) = (cy.saturating_sub(r), (cy + r).min(height));
        for y in y0..y1 {
            for x in x0..x1 {
                let (dx, dy) = (x.abs_diff(cx), y.abs_diff(cy));
                if !disc || dx * dx + dy * dy <= r * r {
                    img.put_pixel(x, y, color);
                }
            }
        }
    }
    for px in img.pixels_mut() {
        let grain = (rng.next() % 9) as i16 - 4;
        for c in &mut px.0 {
            *c = (i16::from(*c) + grain).clamp(0, 255) as u8;
        }
    }
    img
}

/// Parses `WxH`.
pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT"))?;
    let parse = |v: &str| {
        v.parse::<u32>()
            .ok()
            .filter(|&n| (16..=8192).contains(&n))
            .ok_or_else(|| format!("`{s}`: sides must be 16 to 8192 pixels"))
    };
    Ok((parse(w)?, parse(h)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_are_real_files_and_the_same_every_time() {
        let a = generate(&[(96, 64)]).unwrap();
        let b = generate(&[(96, 64)]).unwrap();
        assert_eq!(a.len(), 2);
        assert!(a[0].encoded.starts_with(&[0xff, 0xd8]), "JPEG magic");
        assert!(a[1].encoded.starts_with(b"\x89PNG"), "PNG magic");
        assert!(a.iter().zip(&b).all(|(a, b)| a.encoded == b.encoded));
        assert_eq!(parse_size("1024x768"), Ok((1024, 768)));
        assert!(parse_size("1024").is_err() && parse_size("4x4").is_err());
    }
}
