"""NVSwitch SXid codes: their names, and which the fabric survives.

Taken from leptonai/gpud's catalogue (components/accelerator/nvidia/sxid/sxid.go at commit
4a8de33a3f02e207f39e9023d67125592d599731), itself NVIDIA's Fabric Manager User Guide
(DU-09883-001 v1.3, appendix D: non-fatal, potentially fatal and always fatal SXids). gpud's
event type is kept: WARNING for the SXids the guide says can be ignored or that the NVSwitch
corrects itself (single-bit ECC, a replay, a thermal event), FATAL for the ones whose recovery is
a reboot or an inspection. trainfleet names a node for a FATAL SXid, or for one not listed here
(a check that cannot classify an event names it).
"""

from __future__ import annotations

from types import MappingProxyType

WARNING = "warning"
FATAL = "fatal"

SXID_CATALOGUE: MappingProxyType[int, tuple[str, str]] = MappingProxyType(
    {
        10001: ("Host_priv_error", WARNING),
        10002: ("Host_priv_timeout", WARNING),
        10003: ("Host_unhandled_interrupt", WARNING),
        10004: ("Host_thermal_event_start", WARNING),
        10005: ("Host_thermal_event_end", WARNING),
        11001: ("ingress invalid command", FATAL),
        11004: ("Ingress invalid ACL", FATAL),
        11009: ("ingress invalid VCSet", FATAL),
        11012: ("Single bit ECC errors", WARNING),
        11013: ("ingress header DBE", FATAL),
        11018: ("ingress RID DBE", FATAL),
        11019: ("ingress RLAN DBE", FATAL),
        11020: ("ingress control parity", FATAL),
        11021: ("Single bit ECC errors", WARNING),
        11022: ("Single bit ECC errors", WARNING),
        11023: ("Single bit ECC errors", WARNING),
        12001: ("egress crossbar overflow", FATAL),
        12002: ("egress packet route", FATAL),
        12020: ("egress sequence ID error", FATAL),
        12021: ("Single bit ECC errors", WARNING),
        12022: ("egress input ECC DBE error", FATAL),
        12023: ("Single bit ECC errors", WARNING),
        12024: ("egress output ECC DBE error", FATAL),
        12025: ("egress credit overflow", FATAL),
        12026: ("egress destination request ID error", FATAL),
        12027: ("egress destination response ID error", FATAL),
        12028: ("egress nonposted PRIV error", FATAL),
        12030: ("egress control parity error", WARNING),
        12031: ("egress credit parity error", FATAL),
        12032: ("egress flit type mismatch", FATAL),
        14017: ("TS ATO timeout", FATAL),
        15001: ("route buffer over/underflow", FATAL),
        15006: ("route transdone over/underflow", FATAL),
        15008: ("Single bit ECC errors", WARNING),
        15009: ("route GLT DBE", FATAL),
        15010: ("route parity", FATAL),
        15011: ("Single bit ECC errors", WARNING),
        15012: ("route incoming DBE", FATAL),
        15013: ("route credit parity", FATAL),
        19047: ("NCISOC HDR ECC DBE Error", FATAL),
        19048: ("NCISOC DAT ECC DBE Error", FATAL),
        19049: ("Single bit ECC errors", WARNING),
        19054: ("HDR RAM ECC DBE Error", FATAL),
        19055: ("Single bit ECC errors", WARNING),
        19056: ("DAT0 RAM ECC DBE Error", FATAL),
        19057: ("Single bit ECC errors", WARNING),
        19058: ("DAT1 RAM ECC DBE Error", FATAL),
        19059: ("Single bit ECC errors", WARNING),
        19060: ("CREQ RAM HDR ECC DBE Error", FATAL),
        19061: ("CREQ RAM DAT ECC DBE Error", FATAL),
        19062: ("Single bit ECC errors", WARNING),
        19063: ("Response RAM HDR ECC DBE Error", FATAL),
        19064: ("Response RAM DAT ECC DBE Error", FATAL),
        19065: ("Single bit ECC errors", WARNING),
        19066: ("COM RAM HDR ECC DBE Error", FATAL),
        19067: ("COM RAM DAT ECC DBE Error", FATAL),
        19068: ("Single bit ECC errors", WARNING),
        19069: ("RSP1 RAM HDR ECC DBE Error", FATAL),
        19070: ("RSP1 RAM DAT ECC DBE Error", FATAL),
        19071: ("Single bit ECC errors", WARNING),
        19084: ("AN1 Heartbeat Timeout Error", FATAL),
        20001: ("TX Replay Error", WARNING),
        20009: ("RX Short Error Rate", WARNING),
        20012: ("Broken/inconsistent connection", WARNING),
        20034: ("LTSSM Fault Up", FATAL),
        22003: ("Minion Halt", FATAL),
        22011: ("Minion exterror", FATAL),
        22013: ("Minion Link DLREQ interrupt", WARNING),
        23001: ("ingress SRC-VC buffer overflow", FATAL),
        23002: ("ingress SRC-VC buffer underflow", FATAL),
        23003: ("egress DST-VC credit overflow", FATAL),
        23004: ("egress DST-VC credit underflow", FATAL),
        23005: ("ingress packet burst error", FATAL),
        23006: ("ingress packet sticky error", FATAL),
        23007: ("possible bubbles at ingress", FATAL),
        23008: ("ingress packet invalid dst error", FATAL),
        23009: ("ingress packet parity error", FATAL),
        23010: ("ingress SRC-VC buffer overflow", FATAL),
        23011: ("ingress SRC-VC buffer underflow", FATAL),
        23012: ("egress DST-VC credit overflow", FATAL),
        23013: ("egress DST-VC credit underflow", FATAL),
        23014: ("ingress packet burst error", FATAL),
        23015: ("ingress packet sticky error", FATAL),
        23016: ("possible bubbles at ingress", FATAL),
        23017: ("ingress credit parity error", FATAL),
        24001: ("Single bit ECC errors", WARNING),
        24002: ("Single bit ECC errors", WARNING),
        24003: ("Single bit ECC errors", WARNING),
        24004: ("sourcetrack TCEN0 crubmstore DBE", FATAL),
        24005: ("sourcetrack TCEN0 TD crubmstore DBE", FATAL),
        24006: ("sourcetrack TCEN1 crubmstore DBE", FATAL),
        24007: ("sourcetrack timeout error", FATAL),
    }
)
