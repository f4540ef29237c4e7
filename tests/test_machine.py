"""Reports name a machine by CPU vendor, family, model and kernel flags (issue 49)."""

from __future__ import annotations

from toolrl.machine import parse_cpuinfo, this_machine

ZEN5 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 26
model		: 2
model name	: AMD EPYC
flags		: fpu avx avx2 avx512f avx512_bf16 avx512_vnni

processor	: 1
vendor_id	: AuthenticAMD
"""
SAPPHIRE = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 143
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ROME = """vendor_id	: AuthenticAMD
cpu family	: 23
model		: 49
model name	: AMD EPYC
flags		: avx avx2 fma
"""


def test_two_cpus_with_one_name_are_told_apart():
    zen5, rome = parse_cpuinfo(ZEN5), parse_cpuinfo(ROME)
    assert zen5[3] == rome[3] == "AMD EPYC"
    assert zen5[:3] == ("AuthenticAMD", 26, 2) and rome[:3] == ("AuthenticAMD", 23, 49)
    assert zen5[4] == {"avx2": True, "avx512f": True, "avx512_bf16": True,
                       "avx512_vnni": True, "amx": False}
    assert rome[4]["avx2"] and not rome[4]["avx512f"]


def test_amx_is_any_amx_flag():
    assert parse_cpuinfo(SAPPHIRE)[4]["amx"] is True


def test_this_machine_labels_itself():
    m = this_machine(load_at_start=0.25, torch_threads=2)
    label = m.label()
    assert label.startswith(f"{m.vendor} family {m.family} model {m.model} [")
    assert "torch threads 2" in label and "load average at start 0.2" in label
    assert m.to_dict()["cpu"] == m.cpu


def test_the_matmul_rate_is_a_rate():
    from toolrl.machine import matmul_rate

    assert 1e6 < matmul_rate("float32", n=128, seconds=0.05) < 1e14


def test_flops_per_token():
    from toolrl.machine import transformer_flops_per_token

    # 100 parameters, 2 layers, hidden 4, 8 positions: 2*100 + 2*2*8*4 forward
    assert transformer_flops_per_token(100, 2, 4, 8, training=False) == 328
    assert transformer_flops_per_token(100, 2, 4, 8, training=True) == 3 * 328
