"""The one step of a run that writes the key store: the deploy's, once per run, before its plan.

It retires the keys of nodes no longer in the spec, makes each missing mesh key (and, in a
certificate mesh, the cluster CA), remembers the host keys the nodes present (revoking those
the CA vouched for that are gone: a reimaged node's old ones), and settles a CA move once every
node presents the new CA's certificates. Then it returns the store's snapshot, which the
(pure) plan takes. Drift, the preflight and the benchmark's drift never call it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainfleet import mesh
from trainfleet.key_material import KeyMaterial
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster

if TYPE_CHECKING:
    from trainfleet.plan_types import Gathered


def prepare_keys(store: KeyStore, cluster: Cluster, gathered: Gathered) -> KeyMaterial:
    """Bring the store to what this run's plan needs (``gathered``: the nodes' facts read this
    run) and return its snapshot."""
    names = [n.name for n in cluster.nodes]
    users = cluster.mesh_users
    store.retire_absent(names)
    for user in users:
        for node in names:
            if not store.is_revoked(user, node):
                store.keypair(user, node)  # made on first use, reused afterwards
    if cluster.mesh == "certificates":
        ca = store.certificate_authority()
        if gathered.host_keys is not None:
            # A host key the CA vouched for that its node no longer presents (reimaged, removed
            # from the spec) keeps a valid certificate: the KRL must refuse it from now on.
            seen = {name: found for name, found in gathered.host_keys.items() if found}
            store.record_host_keys(seen, names, mesh.unread_host_keys(cluster, seen))
        if store.ca_moving() and mesh.settles(
            cluster, gathered, ca.public, store.snapshot(users, names)
        ):
            store.ca_settled()  # every node already moved to the new CA: partial runs are safe
        else:
            store.revoke_retired_cas()  # a store whose move settled before CAs were revoked
    return store.snapshot(users, names)
