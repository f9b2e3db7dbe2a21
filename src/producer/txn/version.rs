//! Which transaction protocol a broker offers, and the highest version of each request under it.

use super::super::classify::Api;
use crate::wire::{
    ADD_PARTITIONS_TO_TXN_MAX, END_TXN_MAX, END_TXN_MAX_TV1, END_TXN_MIN_TV2,
    INIT_PRODUCER_ID_MIN_BUMP, PRODUCE_MAX, PRODUCE_MAX_TV1, PRODUCE_MIN_TV2,
    TXN_OFFSET_COMMIT_MAX, TXN_OFFSET_COMMIT_MAX_TV1, TXN_OFFSET_COMMIT_MIN_TV2,
};

/// The transaction protocol in use for a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TxnVersion {
    V1,
    V2,
}

/// What the broker offers that decides the protocol: the finalised `transaction.version` feature and the
/// highest version of each API the broker supports (`None`: not supported at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BrokerCaps {
    pub(crate) transaction_version: i16,
    pub(crate) produce: Option<i16>,
    pub(crate) init_producer_id: Option<i16>,
    pub(crate) txn_offset_commit: Option<i16>,
    pub(crate) end_txn: Option<i16>,
}

impl BrokerCaps {
    /// TV2 needs the feature finalised at 2 or more *and* the request versions that carry it.
    pub(crate) fn txn_version(&self) -> TxnVersion {
        let at_least = |v: Option<i16>, min: i16| v.is_some_and(|v| v >= min);
        if self.transaction_version >= 2
            && at_least(self.produce, PRODUCE_MIN_TV2)
            && at_least(self.txn_offset_commit, TXN_OFFSET_COMMIT_MIN_TV2)
            && at_least(self.end_txn, END_TXN_MIN_TV2)
        {
            TxnVersion::V2
        } else {
            TxnVersion::V1
        }
    }

    /// Whether InitProducerId can bump an epoch with the current id and epoch (KIP-360, v3+).
    pub(crate) fn kip360(&self) -> bool {
        self.init_producer_id
            .is_some_and(|v| v >= INIT_PRODUCER_ID_MIN_BUMP)
    }
}

/// The highest version of `api` this producer may send under transaction version `tv`. Under TV1 the
/// versions that mean "TV2" must not be used inside a transaction, and AddPartitionsToTxn v4+ belongs to
/// brokers.
pub(crate) fn version_cap(api: Api, tv: TxnVersion) -> i16 {
    match (api, tv) {
        (Api::Produce, TxnVersion::V1) => PRODUCE_MAX_TV1,
        (Api::Produce, TxnVersion::V2) => PRODUCE_MAX,
        (Api::TxnOffsetCommit, TxnVersion::V1) => TXN_OFFSET_COMMIT_MAX_TV1,
        (Api::TxnOffsetCommit, TxnVersion::V2) => TXN_OFFSET_COMMIT_MAX,
        (Api::EndTxn, TxnVersion::V1) => END_TXN_MAX_TV1,
        (Api::EndTxn, TxnVersion::V2) => END_TXN_MAX,
        (Api::AddPartitionsToTxn, _) => ADD_PARTITIONS_TO_TXN_MAX,
        (Api::AddOffsetsToTxn, _) => i16::MAX,
        (Api::InitProducerId, _) => i16::MAX,
    }
}
