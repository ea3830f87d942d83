//! A node's stable id: the one fact about a node that the session table, the shared
//! store and the metrics need.
//!
//! Why a module of its own that imports nothing: those three sit below
//! [`cluster`](crate::cluster), which builds the nodes out of the config, the pool
//! and the probes. Taking the id from here lets each of them name a node without
//! depending on what a node is, so no lower layer imports an upper one.
//!
//! Why a newtype of 16 bits: the affinity table stores an id next to every session
//! (16 bytes an entry, a million sessions and more), and a plain `usize` let any
//! count or position pass for a node. An id is handed out once per node *name* by
//! `cluster::upstreams::NodeIds` and never reused, so it indexes a per-node array
//! directly ([`NodeId::index`]) with no map on the request path.

/// Most distinct node names one process can know: ids are never reused, and the
/// affinity table and the metrics keep a slot per id.
pub const MAX_NODE_IDS: usize = 4096;
const _: () = assert!(MAX_NODE_IDS <= u16::MAX as usize);

/// A node's stable id, for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(u16);

impl NodeId {
    /// The id handed out `index`-th, `None` from [`MAX_NODE_IDS`] on.
    pub const fn new(index: usize) -> Option<NodeId> {
        if index < MAX_NODE_IDS {
            // Lossless: MAX_NODE_IDS is below u16::MAX.
            Some(NodeId(index as u16))
        } else {
            None
        }
    }

    /// Its place in a per-node array of [`MAX_NODE_IDS`] slots.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The id handed out `index`-th, for tests that number their nodes.
#[cfg(test)]
pub(crate) fn node(index: usize) -> NodeId {
    NodeId::new(index).expect("a test's node number is below the limit")
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_exist_below_the_limit_and_index_their_own_slot() {
        assert_eq!(NodeId::new(0).map(NodeId::index), Some(0));
        let last = NodeId::new(MAX_NODE_IDS - 1).unwrap();
        assert_eq!(last.index(), MAX_NODE_IDS - 1);
        assert_eq!(NodeId::new(MAX_NODE_IDS), None);
        assert_eq!(NodeId::new(usize::MAX), None);
    }
}
