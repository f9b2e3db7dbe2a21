//! Record-section codecs, all pure Rust, each decompressor bounded by an output cap.
//!
//! Only the record section of a batch is compressed (the 61-byte header never is), so a codec sees one
//! opaque byte string per batch.
//!
//! # References
//! - KIP-98 record batch attributes (codec in bits 0-2); KIP-110 (zstd, codec 4)
//! - snappy-java's stream format (the "xerial" framing the Java client writes for snappy)
//! - LZ4 frame format 1.6; the Java client writes standard frames for magic 2 (the broken header checksum
//!   it keeps for compatibility only applies to magic 0)
//! - RFC 1952 (gzip), RFC 8878 (zstd)

use std::io::{Read, Write};

use super::error::{DecodeError, EncodeError};

/// The compression codec of a batch (attribute bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Records stored as they are.
    #[default]
    None,
    /// gzip (codec 1).
    Gzip,
    /// snappy (codec 2): the xerial-framed stream the Java client writes; raw blocks are read too.
    Snappy,
    /// LZ4 frame format (codec 3).
    Lz4,
    /// Zstandard (codec 4).
    Zstd,
}

impl Compression {
    /// The codec id stored in attribute bits 0-2.
    pub fn id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// The codec for an id from attribute bits 0-2; `None` for ids Kafka does not define.
    pub fn from_id(id: u8) -> Option<Compression> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            _ => return None,
        })
    }
}

/// The default cap on one batch's decompressed record section.
///
/// A broker never hands out a batch bigger than `message.max.bytes` (1 MiB by default, rarely raised past
/// tens of MiB), and compression ratios of real records stay far below 64:1, so 64 MiB leaves room for any
/// real batch while a bomb stops at a bounded cost.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 << 20;

/// The 8-byte magic that opens a snappy-java stream, followed by two big-endian i32s (version 1 and the
/// minimum compatible version 1), then chunks of `[i32 BE length][raw snappy block]`.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
/// snappy-java's default chunk size; the reader accepts any.
const XERIAL_CHUNK: usize = 32 * 1024;

fn bomb(codec: Compression, limit: usize) -> DecodeError {
    DecodeError::DecompressedTooLarge { codec, limit }
}

fn failed(codec: Compression, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Decompress {
        codec,
        message: e.to_string(),
    }
}

/// Decompresses a record section, failing once the output would exceed `limit` bytes.
pub(crate) fn decompress(
    codec: Compression,
    input: &[u8],
    limit: usize,
) -> Result<Vec<u8>, DecodeError> {
    match codec {
        Compression::None => {
            if input.len() > limit {
                return Err(bomb(codec, limit));
            }
            Ok(input.to_vec())
        }
        Compression::Gzip => {
            // The Java client reads concatenated gzip members, so we do too.
            read_capped(
                flate2::read::MultiGzDecoder::new(input),
                codec,
                limit,
                input.len(),
            )
        }
        Compression::Snappy => snappy_decompress(input, limit),
        Compression::Lz4 => read_capped(
            lz4_flex::frame::FrameDecoder::new(input),
            codec,
            limit,
            input.len(),
        ),
        Compression::Zstd => zstd_decompress(input, limit),
    }
}

/// Reads a streaming decoder to its end, one byte past the cap at most, so the cap bounds both time and
/// memory. The first allocation is a guess from the input size, itself bounded by the cap.
fn read_capped(
    reader: impl Read,
    codec: Compression,
    limit: usize,
    input_len: usize,
) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(input_len.saturating_mul(4).min(limit).min(1 << 20));
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| failed(codec, e))?;
    if out.len() > limit {
        return Err(bomb(codec, limit));
    }
    Ok(out)
}

fn snappy_raw_into(block: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<(), DecodeError> {
    let codec = Compression::Snappy;
    // The raw format states its decompressed length up front; check it before allocating.
    let len = snap::raw::decompress_len(block).map_err(|e| failed(codec, e))?;
    if len > limit - out.len() {
        return Err(bomb(codec, limit));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(|e| failed(codec, e))?;
    out.truncate(start + written);
    Ok(())
}

fn snappy_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let codec = Compression::Snappy;
    let mut out = Vec::new();
    if !input.starts_with(&XERIAL_MAGIC) {
        // Not a snappy-java stream: one raw block, as librdkafka-era writers produced (snappy-java reads
        // it the same way).
        snappy_raw_into(input, &mut out, limit)?;
        return Ok(out);
    }
    let mut rest = input
        .get(XERIAL_HEADER_LEN..)
        .ok_or_else(|| failed(codec, "truncated snappy-java stream header"))?;
    while !rest.is_empty() {
        // snappy-java concatenates streams by repeating the header; a chunk length starting with 0x82
        // would be negative, so the magic cannot be mistaken for a chunk.
        if rest.starts_with(&XERIAL_MAGIC) {
            rest = rest
                .get(XERIAL_HEADER_LEN..)
                .ok_or_else(|| failed(codec, "truncated snappy-java stream header"))?;
            continue;
        }
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| failed(codec, "truncated snappy-java chunk length"))?;
        let len = i32::from_be_bytes(*len);
        let len =
            usize::try_from(len).map_err(|_| failed(codec, "negative snappy-java chunk length"))?;
        if len > tail.len() {
            return Err(failed(
                codec,
                "snappy-java chunk runs past the record section",
            ));
        }
        let (block, tail) = tail.split_at(len);
        snappy_raw_into(block, &mut out, limit)?;
        rest = tail;
    }
    Ok(out)
}

fn zstd_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let codec = Compression::Zstd;
    // The window is allocated from a header field, so bound it: never above what the output may reach
    // (with a 1 MiB floor so small caps still read ordinary frames) and never above zstd's usual 128 MiB.
    let max_window = limit.clamp(1 << 20, 128 << 20) as u64;
    let mut out = Vec::with_capacity(input.len().saturating_mul(4).min(limit).min(1 << 20));
    let mut rest = input;
    // A producer may write several frames back to back; zstd-jni reads them as one stream.
    while !rest.is_empty() {
        let decoder =
            ruzstd::decoding::StreamingDecoder::new_with_max_window_size(&mut rest, max_window)
                .map_err(|e| failed(codec, e))?;
        let room = (limit - out.len()) as u64 + 1;
        decoder
            .take(room)
            .read_to_end(&mut out)
            .map_err(|e| failed(codec, e))?;
        if out.len() > limit {
            return Err(bomb(codec, limit));
        }
    }
    Ok(out)
}

/// Compresses a record section as the Java client would, so Java consumers and brokers read it.
pub(crate) fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let failed = |e: &dyn std::fmt::Display| EncodeError::Compress {
        codec,
        message: e.to_string(),
    };
    match codec {
        Compression::None => Ok(input.to_vec()),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(input.len() / 2 + 64),
                flate2::Compression::default(),
            );
            enc.write_all(input).map_err(|e| failed(&e))?;
            enc.finish().map_err(|e| failed(&e))
        }
        Compression::Snappy => {
            let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + input.len() / 2 + 64);
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            let mut block = vec![0u8; snap::raw::max_compress_len(XERIAL_CHUNK.min(input.len()))];
            for chunk in input.chunks(XERIAL_CHUNK) {
                let n = enc.compress(chunk, &mut block).map_err(|e| failed(&e))?;
                // n <= max_compress_len(32 KiB), far below i32::MAX.
                out.extend_from_slice(&(n as i32).to_be_bytes());
                out.extend_from_slice(&block[..n]);
            }
            Ok(out)
        }
        Compression::Lz4 => {
            // Independent 64 KiB blocks: the Java reader decompresses block by block into a buffer of the
            // frame's maximum block size and does not support linked blocks.
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(
                info,
                Vec::with_capacity(input.len() / 2 + 64),
            );
            enc.write_all(input).map_err(|e| failed(&e))?;
            enc.finish().map_err(|e| failed(&e))
        }
        Compression::Zstd => Ok(ruzstd::encoding::compress_to_vec(
            input,
            ruzstd::encoding::CompressionLevel::Fastest,
        )),
    }
}
