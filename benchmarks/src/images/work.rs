//! What each tier of the image application does to a picture, with the `image` crate, as
//! plain functions of bytes: the tiers call them on what they received (a message's bytes or
//! pages mapped from the pool), and the client calls [`pipeline`] once per picture to know
//! what the store must receive. Nothing here knows a transport.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::imageops::{self, FilterType};
use image::{ExtendedColorType, ImageBuffer, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};

use crate::proto::images::Format;

/// Bytes per pixel of the raw pictures the middle tiers pass on (RGB8).
pub const CHANNELS: usize = 3;

/// JPEG quality of the encode tier.
pub const QUALITY: u8 = 85;

/// A picture's raw pixels borrowed in place (from a message or from pool pages).
pub type PixelsRef<'a> = ImageBuffer<Rgb<u8>, &'a [u8]>;

/// The format and size an encoded picture's header declares (ingest's validation).
pub fn probe(encoded: &[u8]) -> Result<(Format, u32, u32), String> {
    let reader = image::ImageReader::new(Cursor::new(encoded))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    let format = match reader.format() {
        Some(ImageFormat::Png) => Format::Png,
        Some(ImageFormat::Jpeg) => Format::Jpeg,
        other => return Err(format!("not a PNG or JPEG picture ({other:?})")),
    };
    let (width, height) = reader.into_dimensions().map_err(|e| e.to_string())?;
    Ok((format, width, height))
}

/// Decode: PNG or JPEG to RGB8 pixels.
pub fn decode(encoded: &[u8]) -> Result<RgbImage, String> {
    image::load_from_memory(encoded)
        .map(|picture| picture.into_rgb8())
        .map_err(|e| e.to_string())
}

/// `pixels` as a `width` × `height` RGB8 picture, if the length matches.
pub fn view(width: u32, height: u32, pixels: &[u8]) -> Result<PixelsRef<'_>, String> {
    let want = width as usize * height as usize * CHANNELS;
    if pixels.len() != want {
        return Err(format!(
            "{width}x{height} RGB8 takes {want} bytes, got {}",
            pixels.len()
        ));
    }
    ImageBuffer::from_raw(width, height, pixels).ok_or_else(|| "bad picture".to_string())
}

/// Resize: to half the width and height, with a triangle (bilinear) filter.
pub fn resize(picture: &PixelsRef<'_>) -> RgbImage {
    let (w, h) = picture.dimensions();
    imageops::resize(
        picture,
        (w / 2).max(1),
        (h / 2).max(1),
        FilterType::Triangle,
    )
}

/// Filter: a 3×3 sharpening convolution, then a little more contrast.
pub fn filter(picture: &PixelsRef<'_>) -> RgbImage {
    const SHARPEN: [f32; 9] = [0.0, -0.25, 0.0, -0.25, 2.0, -0.25, 0.0, -0.25, 0.0];
    let sharpened = imageops::filter3x3(picture, &SHARPEN);
    imageops::colorops::contrast(&sharpened, 12.0)
}

/// The watermark: a translucent white bar with a dark border and a diagonal stripe pattern,
/// made once per process.
pub fn mark() -> RgbaImage {
    let (w, h) = (120u32, 28u32);
    RgbaImage::from_fn(w, h, |x, y| {
        let border = x < 2 || y < 2 || x >= w - 2 || y >= h - 2;
        if border {
            Rgba([20, 20, 20, 200])
        } else if (x + y) % 9 < 3 {
            Rgba([255, 255, 255, 170])
        } else {
            Rgba([255, 255, 255, 60])
        }
    })
}

/// Where the mark goes on a `width` × `height` picture: its top-left corner, 8 pixels from
/// the bottom-right corner (clipped to the picture).
fn mark_origin(width: u32, height: u32, mark: &RgbaImage) -> (u32, u32) {
    (
        width.saturating_sub(mark.width() + 8),
        height.saturating_sub(mark.height() + 8),
    )
}

/// Watermark: the rows of the picture the mark covers, blended with it, each as the byte
/// offset where it goes and its new bytes. Only those bytes change, so a caller whose pixels
/// are shared pool pages writes just them (and copies just the pages they touch).
pub fn watermark(picture: &PixelsRef<'_>, mark: &RgbaImage) -> Vec<(usize, Vec<u8>)> {
    let (width, height) = picture.dimensions();
    let (x0, y0) = mark_origin(width, height, mark);
    let cols = mark.width().min(width - x0);
    let rows = mark.height().min(height - y0);
    let raw: &[u8] = picture.as_raw();
    (0..rows)
        .map(|dy| {
            let y = y0 + dy;
            let offset = (y as usize * width as usize + x0 as usize) * CHANNELS;
            let mut row = raw[offset..offset + cols as usize * CHANNELS].to_vec();
            for dx in 0..cols {
                let Rgba([r, g, b, a]) = *mark.get_pixel(dx, dy);
                let px = &mut row[dx as usize * CHANNELS..][..CHANNELS];
                for (c, m) in px.iter_mut().zip([r, g, b]) {
                    let (c16, m16, a16) = (u16::from(*c), u16::from(m), u16::from(a));
                    *c = ((m16 * a16 + c16 * (255 - a16)) / 255) as u8;
                }
            }
            (offset, row)
        })
        .collect()
}

/// Applies [`watermark`]'s rows to pixels held by value.
pub fn apply(pixels: &mut [u8], rows: &[(usize, Vec<u8>)]) {
    for (offset, row) in rows {
        pixels[*offset..offset + row.len()].copy_from_slice(row);
    }
}

/// Encode: RGB8 pixels to JPEG at [`QUALITY`].
pub fn encode(picture: &PixelsRef<'_>) -> Result<Vec<u8>, String> {
    let (w, h) = picture.dimensions();
    let mut out = Vec::with_capacity(picture.as_raw().len() / 8);
    JpegEncoder::new_with_quality(&mut out, QUALITY)
        .encode(picture.as_raw(), w, h, ExtendedColorType::Rgb8)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// The store's checksum: FNV-1a over the bytes.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the store receives for `encoded`, computed here the tiers' way, in one process: the
/// final picture's width, height, length and checksum.
pub fn pipeline(encoded: &[u8], mark: &RgbaImage) -> Result<(u32, u32, usize, u64), String> {
    let decoded = decode(encoded)?;
    let (w, h) = decoded.dimensions();
    let resized = resize(&view(w, h, decoded.as_raw())?);
    let (w, h) = resized.dimensions();
    let mut filtered = filter(&view(w, h, resized.as_raw())?).into_raw();
    let rows = watermark(&view(w, h, &filtered)?, mark);
    apply(&mut filtered, &rows);
    let jpeg = encode(&view(w, h, &filtered)?)?;
    Ok((w, h, jpeg.len(), checksum(&jpeg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_halves_a_picture_and_ends_in_a_jpeg() {
        let pictures = super::super::picture::generate(&[(64, 48)]).unwrap();
        let mark = mark();
        for p in &pictures {
            let (format, w, h) = probe(&p.encoded).unwrap();
            assert_eq!((format, w, h), (p.format, 64, 48));
            let (w, h, len, sum) = pipeline(&p.encoded, &mark).unwrap();
            assert_eq!((w, h), (32, 24));
            assert!(len > 100, "{len}");
            assert_eq!(pipeline(&p.encoded, &mark).unwrap().3, sum, "deterministic");
        }
    }

    #[test]
    fn the_watermark_changes_only_the_rows_it_covers() {
        let (w, h) = (200u32, 60u32);
        let pixels = vec![100u8; w as usize * h as usize * CHANNELS];
        let rows = watermark(&view(w, h, &pixels).unwrap(), &mark());
        assert_eq!(rows.len(), 28);
        let mut marked = pixels.clone();
        apply(&mut marked, &rows);
        let changed = marked.iter().zip(&pixels).filter(|(a, b)| a != b).count();
        assert!(changed > 0 && changed <= 120 * 28 * CHANNELS, "{changed}");
        assert!(view(w, h, &pixels[1..]).is_err());
    }
}
