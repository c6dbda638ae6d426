"""The certificate mesh (issue #18) on real nodes over real SSH: a key mesh moves to
certificates in one deploy with every login working throughout; a replaced node rejoins by
deploying it alone; a revoked node is refused everywhere, certificate or not."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.lab.harness import LAB_INVENTORY, REPO, deploy_twice, pyinfra, readmit
from tests.lab.test_ssh_mesh import NODES, mesh_matrix
from tests.unit.test_plan import public_key
from trainfleet.certificates import fingerprint
from trainfleet.keystore import KeyStore

DEPLOY = "deploy/cluster.py"
MESH_FILES = [
    "/etc/ssh/ssh_known_hosts",
    "/root/.ssh/authorized_keys",
    "/root/.ssh/config",
    "/root/.ssh/id_trainfleet",
    "/root/.ssh/id_trainfleet-cert.pub",
    "/etc/ssh/trainfleet_revoked_keys",
    "/etc/ssh/sshd_config.d/trainfleet-mesh.conf",
    "/etc/ssh/ssh_host_ed25519_key-cert.pub",
    "/etc/ssh/ssh_config.d/trainfleet-mesh.conf",
]  # no ECDSA host certificate (issue #26)

# Logs in to every node, again and again, until told to stop: what a user's jobs see while
# the deploy runs. A refused login or an unverified host key is a broken mesh. sshd itself
# drops the logins in flight when it restarts to present new host certificates (SIGHUP, as
# `systemctl reload ssh` sends): a login that fails is tried once more at once ("again"), and
# only a login that fails twice ("fail") is a broken mesh; the retries are counted too. Rounds
# are a quarter second apart: jobs log in often, but a hot loop of logins on every node would
# take the CPU the deploy under test needs (and a login's own handshake takes longer than that).
# Each line carries when its login began and ended (epoch seconds), to set beside the deploy's
# steps when one fails. A login under way when the nodes change what they present finishes
# before the old trust goes (the deploy waits MESH_MOVE_GRACE_SECONDS): without the wait a CI
# run saw a retry refused halfway, the old trust dropped about 0.6 s after sshd's restart.
PROBER = r"""
log=/run/tf-prober.log stop=/run/tf-prober.stop
rm -f "$stop"; : > "$log"
login() { ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5 "$1" true 2>&1; }
while [ ! -e "$stop" ]; do
  for peer in {peers}; do
    t0=$(date +%s.%N)
    if out=$(login "$peer"); then echo "ok $peer $t0 $(date +%s.%N)" >> "$log"
    elif sleep 0.2; again=$(login "$peer")
    then echo "again $peer $t0 $(date +%s.%N) $(echo "$out" | tr '\r\n' '  ')" >> "$log"
    else echo "fail $peer $t0 $(date +%s.%N) $(echo "$out $again" | tr '\r\n' '  ')" >> "$log"
    fi
  done
  sleep 0.25
done
echo done >> "$log"
"""
SSHD_RESTART = "Received SIGHUP; restarting."
GRACE = "Logins under way finish before the old trust goes"


def start_probers(lab) -> None:
    script = PROBER.replace("{peers}", " ".join(NODES))
    for node in NODES:
        lab.ssh(
            node,
            "cat > /run/tf-prober.sh && (setsid sh /run/tf-prober.sh </dev/null >/dev/null 2>&1 &)",
            input=script,
        )


def sshd_restarts(lab) -> dict[str, int]:
    """How often each node's sshd has restarted so far (its log, as the lab keeps it)."""
    return {
        node: (lab.lab.node(node).dir / "node.log").read_text(errors="replace").count(SSHD_RESTART)
        for node in NODES
    }


def assert_every_login_worked(logs: dict[str, list[str]], restarts: dict[str, int]) -> None:
    """No login failed twice; a login that failed once did so only against a node whose sshd
    restarted meanwhile, at most once per prober and restart."""
    lines = [line for node_lines in logs.values() for line in node_lines]
    assert [line for line in lines if not line.startswith(("ok ", "again "))] == [], logs
    retried = Counter(line.split()[1] for line in lines if line.startswith("again "))
    assert all(retried[peer] <= len(NODES) * restarts[peer] for peer in retried), (
        retried,
        restarts,
    )


def deploy_while_probing(lab):
    """The lab's deploy with every node's prober logging in throughout: the run, each prober's
    lines, and how often each node's sshd restarted meanwhile."""
    before = sshd_restarts(lab)
    start_probers(lab)
    try:
        move = pyinfra(LAB_INVENTORY, DEPLOY)
    finally:
        logs = stop_probers(lab)
    restarts = {node: count - before[node] for node, count in sshd_restarts(lab).items()}
    return move, logs, restarts


def stop_probers(lab) -> dict[str, list[str]]:
    """Each node's probe lines, once its prober has finished its last round."""
    for node in NODES:
        lab.ssh(node, "touch /run/tf-prober.stop")
    logs: dict[str, list[str]] = {}
    deadline = time.monotonic() + 60
    while len(logs) < len(NODES) and time.monotonic() < deadline:
        for node in NODES:
            lines = lab.host(node).file("/run/tf-prober.log").content_string.splitlines()
            if lines[-1:] == ["done"]:
                logs[node] = lines[:-1]
        time.sleep(0.5)
    assert len(logs) == len(NODES), f"probers did not stop: {set(NODES) - set(logs)}"
    return logs


def mesh_files(lab, node: str) -> dict[str, str | None]:
    """The node's text mesh files (the KRL, binary, is left out: see ``mesh_digests``)."""
    return lab.read(
        node, [path for path in MESH_FILES if path != "/etc/ssh/trainfleet_revoked_keys"]
    )


def mesh_digests(lab, node: str) -> dict[str, str]:
    """sha256 of each of the node's mesh files ("missing" where there is none)."""
    out = lab.ssh(
        node,
        "for f in " + " ".join(MESH_FILES) + "; do "
        'if [ -f "$f" ]; then sha256sum "$f"; else echo "missing $f"; fi; done',
    )
    return {path: digest for digest, path in (line.split(None, 1) for line in out.splitlines())}


def managed_block(text: str, purpose: str) -> list[str]:
    lines = text.splitlines()
    begin = lines.index(f"# BEGIN trainfleet managed block: {purpose} (do not edit)")
    return lines[begin + 1 : lines.index(f"# END trainfleet managed block: {purpose}")]


def offered_host_key_algorithms(lab, src: str, dst: str) -> set[str]:
    """The host key algorithms ``dst``'s sshd offers (its KEXINIT, as ``ssh -vv`` from ``src`` logs
    it)."""
    lines = lab.ssh(src, f"ssh -vv -n -o BatchMode=yes {dst} true 2>&1").splitlines()
    peer = next(i for i, line in enumerate(lines) if "peer server KEXINIT proposal" in line)
    offer = next(line for line in lines[peer:] if "host key algorithms: " in line)
    return set(offer.split("host key algorithms: ", 1)[1].strip().split(","))


@pytest.fixture(scope="module")
def certs(lab, tmp_path_factory):
    """A fresh lab converged as a key mesh (``ssh.mesh: keys``); the first test moves it."""
    lab.fresh(3)
    keys_inventory = lab.spec_inventory(tmp_path_factory.mktemp("keys"), ssh={"mesh": "keys"})
    deploy_twice(keys_inventory, DEPLOY)
    return SimpleNamespace(lab=lab, keys_inventory=keys_inventory)


def test_a_key_mesh_moves_to_certificates_in_one_deploy_with_every_login_working_throughout(certs):
    lab = certs.lab
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}
    before = lab.read("node1", ["/etc/ssh/ssh_known_hosts"])["/etc/ssh/ssh_known_hosts"]
    assert len(managed_block(before, "ssh mesh host keys")) == 2 * len(
        NODES
    )  # ed25519 + ecdsa per node
    offered_before = offered_host_key_algorithms(lab, "node2", "node1")

    move, logs, restarts = deploy_while_probing(lab)  # the lab's spec says nothing: certificates
    assert move.returncode == 0, move.describe()
    again = pyinfra(LAB_INVENTORY, DEPLOY)
    assert again.returncode == 0 and again.changed() == {}, again.describe()
    assert set(move.changed()[GRACE]) == set(NODES)

    # Every login of every prober worked, before, during and after the move; each pair was tried.
    assert_every_login_worked(logs, restarts)
    assert all({line.split()[1] for line in lines} == set(NODES) for lines in logs.values()), logs
    # And now by certificate: one CA line, one authorized line, host and user certificates.
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}
    for node in NODES:
        files = mesh_files(lab, node)
        (ca_line,) = managed_block(files["/etc/ssh/ssh_known_hosts"], "ssh mesh host keys")
        assert ca_line.startswith(
            "@cert-authority node?,node?.lab.trainfleet.test,198.18.0.?? ssh-ed25519 "
        )
        (trust,) = managed_block(files["/root/.ssh/authorized_keys"], "ssh mesh keys")
        assert trust.startswith('cert-authority,principals="root" ssh-ed25519 ')
        assert files["/root/.ssh/id_trainfleet-cert.pub"].startswith(
            "ssh-ed25519-cert-v01@openssh.com "
        )
        listed = lab.ssh(node, "ssh-keygen -L -f /etc/ssh/ssh_host_ed25519_key-cert.pub")
        assert "Type: ssh-ed25519-cert-v01@openssh.com host certificate" in listed
        assert all(
            f"\n                {name}\n" in listed
            for name in (node, f"{node}.lab.trainfleet.test", lab.lab.node(node).address)
        )
    # sshd offers what it did before and one host certificate more: its ed25519 key's (issue #26).
    assert offered_host_key_algorithms(lab, "node2", "node1") == offered_before | {
        "ssh-ed25519-cert-v01@openssh.com"
    }
    for node in NODES:
        presented = lab.ssh("node2", f"ssh-keyscan -c {node} 2>/dev/null").split(
            "\n"
        )  # "type blob"
        types = {line.split()[0] for line in presented if line.strip() and not line.startswith("#")}
        assert types == {"ssh-ed25519-cert-v01@openssh.com"}, presented
        assert (
            lab.ssh(node, "grep HostCertificate /etc/ssh/sshd_config.d/trainfleet-mesh.conf")
            == "HostCertificate /etc/ssh/ssh_host_ed25519_key-cert.pub\n"
        )
        assert lab.ssh(node, "ls /etc/ssh/ssh_host_ecdsa_key-cert.pub", check=False) == ""
    # The login really used the certificates (not a leftover key): ssh says so.
    verbose = lab.ssh("node1", "ssh -v -o BatchMode=yes node2 true 2>&1")
    assert "matches the ED25519-CERT host certificate" in verbose
    assert "Server accepts key: /root/.ssh/id_trainfleet ED25519-CERT" in verbose


def test_a_replaced_node_rejoins_by_deploying_it_alone(certs, tmp_path):
    lab = certs.lab
    others = {node: mesh_digests(lab, node) for node in ("node1", "node2")}
    # node3 is reimaged: new host keys, a stock sshd, no mesh files (the operator's key kept). The
    # operator takes its new host keys into the controller's known_hosts (read over the verified
    # connection). What a thief of the old image would hold, its host key and still-valid
    # certificate, is kept aside on node3 for the next test.
    lab.ssh(
        "node3",
        "mkdir -p -m 700 /root/old-image && cp -p /etc/ssh/ssh_host_ed25519_key "
        "/etc/ssh/ssh_host_ed25519_key-cert.pub /root/old-image/",
    )
    new_keys = lab.ssh(
        "node3",
        "sed -i '/BEGIN trainfleet/,/END trainfleet/d' /root/.ssh/authorized_keys && rm -rf "
        "/root/.ssh/id_trainfleet* /root/.ssh/config /etc/ssh/ssh_host_* "
        "/etc/ssh/sshd_config.d/trainfleet-mesh.conf /etc/ssh/trainfleet_revoked_keys "
        "/etc/ssh/ssh_known_hosts && ssh-keygen -A >/dev/null && cat /etc/ssh/ssh_host_*_key.pub "
        "&& kill -HUP $(cat /run/sshd.pid)",
    )
    known = [
        line
        for line in lab.lab.known_hosts.read_text().splitlines()
        if not line.startswith("node3,")
    ]
    known += [
        f"node3,{lab.lab.node('node3').address} {' '.join(line.split()[:2])}"
        for line in new_keys.splitlines()
    ]
    lab.lab.known_hosts.write_text("\n".join(known) + "\n")
    lab.wait_for_login("node3")  # its sshd restarted with the new host keys
    assert mesh_matrix(lab)["node1"]["node3"] == ""  # the others cannot verify it yet

    first = pyinfra(LAB_INVENTORY, DEPLOY, limit="node3")
    assert first.returncode == 0, first.describe()
    again = pyinfra(LAB_INVENTORY, DEPLOY, limit="node3")
    assert again.returncode == 0 and again.changed() == {}, again.describe()

    assert {node: mesh_digests(lab, node) for node in others} == others  # not one byte elsewhere
    assert all(digest != "missing" for files in others.values() for digest in files.values())
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}


def test_a_reimaged_nodes_old_host_key_is_refused_by_every_users_ssh_by_name_and_by_address(certs):
    """Issue #26: the KRL holds node3's old host key once every node was deployed; a throwaway
    sshd presenting that key and its still-valid certificate (at node3's address, port 2299:
    HostKeyAlias makes ssh check it as node3 or its address on port 22) is refused by the mesh
    user by address and by a user without any mesh block by name, through the system-wide
    ssh_config.d drop-in."""
    lab = certs.lab
    deploy_twice(LAB_INVENTORY, DEPLOY)  # node1 and node2 learn the KRL of the reimage
    address = lab.lab.node("node3").address
    old = "/root/old-image/ssh_host_ed25519_key"
    lab.ssh(
        "node3",
        f"/usr/sbin/sshd -f /dev/null -o HostKey={old} -o HostCertificate={old}-cert.pub "
        f"-o ListenAddress={address}:2299 -o PidFile=/run/tf-old-image.pid",
    )
    lab.ssh("node1", "id tfguest >/dev/null 2>&1 || useradd -m tfguest")
    thief = (
        "ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes -o HostKeyAlias={alias} -p 2299 "
        "{address} true 2>&1"
    )
    as_guest = "su -s /bin/sh tfguest -c {command}"
    try:
        attempts = {
            ("root", address): lab.ssh(
                "node1", thief.format(alias=address, address=address), check=False
            ),
            ("root", "node3"): lab.ssh(
                "node1", thief.format(alias="node3", address=address), check=False
            ),
            ("tfguest", "node3"): lab.ssh(
                "node1",
                as_guest.format(command=shlex.quote(thief.format(alias="node3", address=address))),
                check=False,
            ),
            ("tfguest", address): lab.ssh(
                "node1",
                as_guest.format(command=shlex.quote(thief.format(alias=address, address=address))),
                check=False,
            ),
        }
        # The control: the same ssh without the system config takes the old certificate (only the
        # KRL refuses it).
        control = lab.ssh(
            "node1",
            as_guest.format(
                command=shlex.quote(
                    thief.format(alias="node3", address=address).replace(
                        "ssh -n", "ssh -F /dev/null -n"
                    )
                )
            ),
            check=False,
        )
    finally:
        lab.ssh("node3", "kill $(cat /run/tf-old-image.pid); rm -rf /root/old-image", check=False)
    for (user, name), answer in attempts.items():
        assert "revoked by file /etc/ssh/trainfleet_revoked_keys" in answer, (user, name, answer)
        assert "Host key verification failed" in answer, (user, name, answer)
    assert "Permission denied" in control and "revoked" not in control, control
    assert mesh_matrix(lab) == {
        src: {dst: dst for dst in NODES} for src in NODES
    }  # node3's new key: trusted


def test_a_revoked_node_is_refused_everywhere_even_with_its_still_valid_certificate(certs):
    lab = certs.lab
    keys_cli = [sys.executable, "-m", "trainfleet", "keys"]
    # What a thief of node2's mesh identity would hold: its key and its certificate.
    lab.ssh(
        "node2",
        "mkdir -p -m 700 /root/stolen && cp /root/.ssh/id_trainfleet "
        "/root/.ssh/id_trainfleet-cert.pub /root/stolen/",
    )
    stolen_key = KeyStore("lab").keypair("root", "node2").public
    subprocess.run([*keys_cli, "revoke", str(lab.lab.spec), "node2"], check=True, cwd=REPO)
    try:
        deploy_twice(LAB_INVENTORY, DEPLOY)

        stolen = (
            "ssh -n -o BatchMode=yes -o IdentitiesOnly=yes -i /root/stolen/id_trainfleet -o "
            "CertificateFile=/root/stolen/id_trainfleet-cert.pub {peer} hostname 2>&1; echo rc=$?"
        )
        assert "Valid: from" in lab.ssh(
            "node2", "ssh-keygen -L -f /root/stolen/id_trainfleet-cert.pub"
        )
        for peer in ("node1", "node3"):
            answer = lab.ssh("node2", stolen.format(peer=peer))
            assert "Permission denied" in answer and answer.rstrip().endswith("rc=255"), answer
        assert (
            lab.ssh(
                "node2",
                "ls /root/.ssh/id_trainfleet /root/.ssh/id_trainfleet-cert.pub",
                check=False,
            )
            == ""
        )
        matrix = mesh_matrix(lab)
        assert matrix["node2"] == {"node1": "", "node2": "", "node3": ""}
        assert matrix["node1"] == {
            dst: dst for dst in NODES
        }  # the others still reach node2 (its host cert)
    finally:
        subprocess.run([*keys_cli, "rotate", str(lab.lab.spec), "node2"], check=True, cwd=REPO)
        lab.ssh("node2", "rm -rf /root/stolen")
    deploy_twice(LAB_INVENTORY, DEPLOY)
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}
    revoked = KeyStore(
        "lab"
    ).revoked_keys()  # the stolen key stays refused after the rotation, not the new one
    assert stolen_key in revoked and KeyStore("lab").keypair("root", "node2").public not in revoked


def test_drift_names_a_certificate_the_spec_now_wants_shorter_and_the_deploy_renews_it(
    certs, tmp_path
):
    lab = certs.lab
    shorter = lab.spec_inventory(tmp_path, ssh={"certificate_days": 30})
    drift = pyinfra(shorter, "deploy/drift.py")
    assert drift.returncode != 0
    for node in NODES:
        assert f"[{node}] host certificates" in drift.stdout + drift.stderr, drift.describe()
    deploy_twice(shorter, DEPLOY)
    clean = pyinfra(shorter, "deploy/drift.py")
    assert clean.returncode == 0, clean.describe()
    deploy_twice(LAB_INVENTORY, DEPLOY)  # back to the lab's validity


def test_a_host_certificate_signed_by_another_ca_is_named_by_drift_and_signed_anew_by_the_deploy(
    certs,
):
    """Issue #26: certificates are verified, not only read. node2's host certificate is replaced by
    one another CA signed for the same key, names and key id (what a forger, or a site's script
    gone wrong, leaves): drift names it, the deploy signs it anew, the next changes nothing."""
    lab = certs.lab
    names = ",".join(["node2", "node2.lab.trainfleet.test", lab.lab.node("node2").address])
    lab.ssh(
        "node2",
        "set -e; d=$(mktemp -d); ssh-keygen -q -t ed25519 -N '' -f $d/ca; cp "
        "/etc/ssh/ssh_host_ed25519_key.pub $d/host.pub; ssh-keygen -q -s $d/ca -I "
        f"trainfleet:lab:host:node2 -h -n {names} -V -5m:+52w $d/host.pub; printf '%s "
        "trainfleet:lab:host:node2\\n' \"$(cut -d' ' -f1,2 $d/host-cert.pub)\" > "
        "/etc/ssh/ssh_host_ed25519_key-cert.pub; rm -rf $d",
    )
    assert "Signing CA: ED25519 " + fingerprint(
        KeyStore("lab").certificate_authority().public
    ) not in lab.ssh("node2", "ssh-keygen -L -f /etc/ssh/ssh_host_ed25519_key-cert.pub")
    drift = pyinfra(LAB_INVENTORY, "deploy/drift.py")
    assert drift.returncode != 0 and "[node2] host certificates" in drift.stdout + drift.stderr, (
        drift.describe()
    )
    assert "[node1] host certificates" not in drift.stdout + drift.stderr
    first, _ = deploy_twice(LAB_INVENTORY, DEPLOY)
    assert {node for nodes in first.changed().values() for node in nodes} == {"node2"}, (
        first.describe()
    )
    signer = fingerprint(KeyStore("lab").certificate_authority().public)
    assert f"Signing CA: ED25519 {signer}" in lab.ssh(
        "node2", "ssh-keygen -L -f /etc/ssh/ssh_host_ed25519_key-cert.pub"
    )
    assert pyinfra(LAB_INVENTORY, "deploy/drift.py").returncode == 0
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}


def test_a_new_cluster_ca_takes_over_in_one_deploy_with_every_login_working_throughout(certs):
    lab = certs.lab
    keys_cli = [sys.executable, "-m", "trainfleet", "keys"]
    old_ca = subprocess.run(
        [*keys_cli, "ca", str(lab.lab.spec)], check=True, cwd=REPO, capture_output=True, text=True
    ).stdout.split()[1]
    subprocess.run(
        [*keys_cli, "rotate-ca", str(lab.lab.spec)], check=True, cwd=REPO, capture_output=True
    )
    new_ca = KeyStore("lab").certificate_authority().public.split()[1]
    assert new_ca != old_ca

    move, logs, restarts = deploy_while_probing(lab)
    assert move.returncode == 0, move.describe()
    again = pyinfra(LAB_INVENTORY, DEPLOY)
    assert again.returncode == 0 and again.changed() == {}, again.describe()

    assert_every_login_worked(logs, restarts)
    assert set(move.changed()[GRACE]) == set(NODES)  # the moving run waited; the re-run did not
    # The move's run put the old CA in the KRL (no node failed): every sshd and ssh refuses
    # whatever it signed, and the re-run above, the store settled, changed nothing.
    assert set(
        move.changed()["Revoked mesh keys and the old CA (/etc/ssh/trainfleet_revoked_keys)"]
    ) == set(NODES)
    for node in NODES:
        assert "REVOKED" in lab.ssh(
            node,
            f"echo 'ssh-ed25519 {old_ca}' > /run/old-ca.pub; "
            "ssh-keygen -Q -f /etc/ssh/trainfleet_revoked_keys /run/old-ca.pub",
            check=False,
        )
        files = mesh_files(lab, node)
        assert old_ca not in "".join(
            text or "" for text in files.values()
        )  # trusted nowhere, signs nothing
        assert new_ca in managed_block(files["/etc/ssh/ssh_known_hosts"], "ssh mesh host keys")[0]
        signer = fingerprint(KeyStore("lab").certificate_authority().public)
        assert f"Signing CA: ED25519 {signer}" in lab.ssh(
            node, "ssh-keygen -L -f /root/.ssh/id_trainfleet-cert.pub"
        )
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}


def test_a_ca_rotation_with_a_node_down_completes_without_it_and_the_node_rejoins_later(
    certs, tmp_path
):
    lab = certs.lab
    keys_cli = [sys.executable, "-m", "trainfleet", "keys"]
    old_ca = KeyStore("lab").certificate_authority().public.split()[1]
    subprocess.run(
        [*keys_cli, "rotate-ca", str(lab.lab.spec)], check=True, cwd=REPO, capture_output=True
    )
    new_ca = KeyStore("lab").certificate_authority().public.split()[1]
    rest = ["node1", "node2"]
    lab.lab.stop("node3")
    try:
        stuck = pyinfra(LAB_INVENTORY, DEPLOY)  # node3 down: nothing moves, and nothing would, ever
        assert stuck.returncode != 0, stuck.describe()
        assert "deploy the whole cluster at once" in stuck.stderr, stuck.describe()
        # The operator's way through: node3 out of the spec; the rest move, and the move settles.
        deploy_twice(lab.spec_inventory(tmp_path, keep=rest), DEPLOY)
        assert not KeyStore("lab").ca_moving()
        assert not list((KeyStore("lab").dir / ".ca" / "retired").glob("*/ca"))  # old CA key gone
        for node in rest:
            assert old_ca not in "".join(text or "" for text in mesh_files(lab, node).values())
        assert mesh_matrix(lab, rest) == {src: {dst: dst for dst in rest} for src in rest}
    finally:
        lab.lab.start("node3")
    # node3 back in the spec: its host keys (revoked when it left) taken back; one deploy.
    readmit(lab, "node3")
    deploy_twice(LAB_INVENTORY, DEPLOY)
    files = mesh_files(lab, "node3")
    assert old_ca not in "".join(text or "" for text in files.values())
    assert new_ca in managed_block(files["/etc/ssh/ssh_known_hosts"], "ssh mesh host keys")[0]
    signer = fingerprint(KeyStore("lab").certificate_authority().public)
    listed = lab.ssh("node3", "ssh-keygen -L -f /etc/ssh/ssh_host_ed25519_key-cert.pub")
    assert f"Signing CA: ED25519 {signer}" in listed
    assert mesh_matrix(lab) == {src: {dst: dst for dst in NODES} for src in NODES}


def test_a_node_down_during_the_first_deploy_joins_later_changing_nothing_on_the_others(
    lab3, tmp_path
):
    """(Last in the module: a fresh lab of its own.) New servers (every host key new), node3 down
    while they are first deployed, with the controller's store from the cluster's earlier life
    (it vouched for another host key of node3): the first deploy revokes that key already (the
    controller's known_hosts lists other keys for node3), so when node3 is back, the deploy that
    takes it in changes no file of the others' mesh (the KRL byte for byte) and no step there."""
    home = {"TRAINFLEET_HOME": str(tmp_path / "home")}  # nothing on the nodes, a store of its own
    store = KeyStore("lab", root=tmp_path / "home" / "keys")
    earlier = public_key()  # node3's host key in the cluster's earlier life
    store.record_host_keys({"node3": [earlier]}, NODES)
    lab3.lab.stop("node3")
    try:
        first = pyinfra(LAB_INVENTORY, DEPLOY, env=home)
    finally:
        lab3.lab.start("node3")
    assert first.returncode != 0 and "[node3] Could not connect" in first.stderr, first.describe()
    converged = ("node1", "node2")
    before = {node: mesh_digests(lab3, node) for node in converged}
    revoked = store.revoked_keys()
    assert [" ".join(line.split()[:2]) for line in revoked] == [
        earlier
    ]  # gone while node3 was down

    joined = pyinfra(LAB_INVENTORY, DEPLOY, env=home)

    assert joined.returncode == 0, joined.describe()
    elsewhere = {
        op: sorted(set(hosts) & set(converged))
        for op, hosts in joined.changed().items()
        if set(hosts) & set(converged)
    }
    assert elsewhere == {}, elsewhere
    assert {node: mesh_digests(lab3, node) for node in converged} == before
    assert store.revoked_keys() == revoked
    again = pyinfra(LAB_INVENTORY, DEPLOY, env=home)
    assert again.returncode == 0 and again.changed() == {}, again.describe()
    assert mesh_matrix(lab3) == {src: {dst: dst for dst in NODES} for src in NODES}
    assert "REVOKED" in lab3.ssh(
        "node1",
        f"echo '{earlier}' > /run/earlier.pub; "
        "ssh-keygen -Q -f /etc/ssh/trainfleet_revoked_keys /run/earlier.pub",
        check=False,
    )
