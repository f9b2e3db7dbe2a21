//! Codec details the Java client depends on.

use super::*;

/// Snappy is written in snappy-java's framing (magic, version, chunks of at most 32 KiB), the only
/// snappy the Java client reads, and reads back to the input.
#[test]
fn snappy_is_written_in_snappy_java_framing() {
    let input: Vec<u8> = (0..100_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    let out = compression::compress(Compression::Snappy, &input).unwrap();
    assert_eq!(&out[..8], &[0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0]);
    assert_eq!(&out[8..16], &[0, 0, 0, 1, 0, 0, 0, 1]);
    // Chunks of at most 32 KiB uncompressed, each `[i32 BE length][raw block]`.
    let mut rest = &out[16..];
    let mut total = 0;
    while !rest.is_empty() {
        let len = i32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let block = &rest[4..4 + len];
        let n = snap::raw::decompress_len(block).unwrap();
        assert!(n <= 32 * 1024);
        total += n;
        rest = &rest[4 + len..];
    }
    assert_eq!(total, input.len());
    assert_eq!(
        compression::decompress(Compression::Snappy, &out, 1 << 30).unwrap(),
        input
    );
}

/// Snappy input is read whether it is a raw block or several snappy-java streams back to back.
#[test]
fn snappy_raw_blocks_and_concatenated_streams_are_read() {
    let raw = snap::raw::Encoder::new()
        .compress_vec(b"a raw block")
        .unwrap();
    assert_eq!(
        compression::decompress(Compression::Snappy, &raw, 1 << 20).unwrap(),
        b"a raw block"
    );
    let mut two = compression::compress(Compression::Snappy, b"first ").unwrap();
    two.extend_from_slice(&compression::compress(Compression::Snappy, b"second").unwrap());
    assert_eq!(
        compression::decompress(Compression::Snappy, &two, 1 << 20).unwrap(),
        b"first second"
    );
}

/// LZ4 is written as a standard version 1 frame with independent blocks of at most 64 KiB, the shape the
/// Java client expects.
#[test]
fn lz4_frames_use_independent_64k_blocks() {
    let out = compression::compress(Compression::Lz4, &[1u8; 200_000]).unwrap();
    assert_eq!(&out[..4], &[0x04, 0x22, 0x4d, 0x18]);
    let flg = out[4];
    assert_eq!(flg >> 6, 0b01, "frame version 1");
    assert_ne!(flg & 0x20, 0, "block independence");
    assert_eq!((out[5] >> 4) & 0x7, 4, "64 KiB maximum block size");
}

/// Gzip input made of several members back to back decompresses to all of them, not just the first.
#[test]
fn gzip_reads_concatenated_members() {
    let mut two = compression::compress(Compression::Gzip, b"one ").unwrap();
    two.extend_from_slice(&compression::compress(Compression::Gzip, b"two").unwrap());
    assert_eq!(
        compression::decompress(Compression::Gzip, &two, 1 << 20).unwrap(),
        b"one two"
    );
}

/// Zstd input made of several frames back to back decompresses to all of them, not just the first.
#[test]
fn zstd_reads_concatenated_frames() {
    let mut two = compression::compress(Compression::Zstd, b"one ").unwrap();
    two.extend_from_slice(&compression::compress(Compression::Zstd, b"two").unwrap());
    assert_eq!(
        compression::decompress(Compression::Zstd, &two, 1 << 20).unwrap(),
        b"one two"
    );
}

/// Codec ids are the protocol's (none 0, gzip 1, snappy 2, lz4 3, zstd 4) both ways, and no other id
/// maps to a codec.
#[test]
fn codec_ids_match_the_protocol() {
    for (c, id) in ALL_CODECS.iter().zip(0u8..) {
        assert_eq!(c.id(), id);
        assert_eq!(Compression::from_id(id), Some(*c));
    }
    assert_eq!(Compression::from_id(5), None);
}
