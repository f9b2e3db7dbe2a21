//! The line a revocation's flush prints, over a bare group-commit queue with a fake transaction runner.

use bytes::Bytes;

use super::*;
use crate::snapshot::fold::{BoxError, Change, Outputs};
use crate::snapshot::group_commit::Entry;
use crate::snapshot::group_commit::{GroupCommit, MetadataSource, TransactionRunner};
use crate::snapshot::TxnFailure;
use crate::telemetry::capture::capture;
use crate::GroupMetadata;

/// Counts events per key.
struct Count;

impl Fold for Count {
    type State = u64;
    fn fold(
        &self,
        _key: &Bytes,
        n: &mut Option<u64>,
        _event: &crate::records::Record,
        _out: &mut Outputs,
    ) -> Change {
        *n.get_or_insert(0) += 1;
        Change::Update
    }
    fn encode(&self, n: &u64) -> Bytes {
        Bytes::copy_from_slice(&n.to_be_bytes())
    }
    fn decode(&self, b: &[u8]) -> Result<u64, BoxError> {
        Ok(u64::from_be_bytes(b.try_into()?))
    }
}

/// Commits everything.
struct Commits;

impl TransactionRunner for Commits {
    fn begin(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }
    async fn send(&mut self, _entry: Entry) -> Result<(), TxnFailure> {
        Ok(())
    }
    async fn settle(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }
    async fn commit(&mut self, _offset: i64, _metadata: GroupMetadata) -> Result<(), TxnFailure> {
        Ok(())
    }
    async fn abort(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }
}

/// An operator following a handover sees which offset the old owner committed last: the flush on
/// revoke says "committing on revoke" with the partition and the offset it commits, once, and a
/// fenced partition (which commits nothing) says nothing of the kind.
#[test]
fn a_revocation_flush_says_which_offset_it_commits() {
    let metadata: Arc<dyn MetadataSource> =
        Arc::new(|| Some(GroupMetadata::new("g", 1, "m", None).unwrap()));
    let ((), lines) = capture(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                for (partition, fenced) in [(3, false), (4, true)] {
                    let writer =
                        GroupCommit::new(partition, Commits, Arc::clone(&metadata), 0, 256, 64)
                            .unwrap();
                    let mut core = PartitionCore::new(0);
                    for i in 0..7 {
                        let event = crate::records::Record {
                            offset: i,
                            timestamp: 0,
                            timestamp_type: crate::records::TimestampType::CreateTime,
                            key: Some(Bytes::from(format!("key-{i}"))),
                            value: None,
                            headers: Vec::new(),
                        };
                        core.handle_event(&Count, &event);
                    }
                    let lane = Lane::new(partition, core, writer);
                    if fenced {
                        lane.core().handle_fenced();
                    }
                    flush_lane(&Count, &lane).await.unwrap();
                }
            })
    });
    let said = lines.containing("committing on revoke");
    assert_eq!(said.len(), 1, "only the partition that still commits");
    assert_eq!(said[0].field("partition"), Some("3"));
    assert_eq!(
        said[0].field("offset"),
        Some("7"),
        "past the seven folded events"
    );
}
