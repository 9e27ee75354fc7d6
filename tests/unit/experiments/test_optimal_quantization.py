"""`terngrad reproduce orq`: the plan of the comparison, its paired comparisons and Algorithm
2's rows."""

from terngrad import quantize
from terngrad.experiments import optimal_quantization as oq


def test_the_full_plan_runs_every_method_with_seeds_and_both_broadcasts(tmp_path):
    base = oq.protocol(str(tmp_path), "lenet", "mnist", None, 4, 600)
    runs = oq.ORQComparison(base).plan()
    per_variant = len(oq.SEEDED) * 3 + len(oq.DEFAULT_METHODS) - len(oq.SEEDED)
    assert len(runs) == 2 * per_variant + len(oq.ALGORITHM2)
    assert len({r.config.out for r in runs}) == len(runs)  # one folder each

    def variant(method, name):
        return [r for r in runs if r.method == method and r.tags["variant"] == name]

    orq = variant("orq-9", "clip")[0].config
    assert (
        orq.hook_options.make_quantizer().options == quantize.get("orq", levels=9, clip=2.5).options
    )
    assert orq.hook_options.make_quantizer().bucket_size == oq.BUCKET
    x = orq.hook_options
    assert (x.topology, x.quantize_last, x.min_numel) == ("allgather", True, 0)
    assert orq.warmup_steps == 60
    plain = variant("terngrad-b512", "noclip")
    assert [r.config.seed for r in plain] == [0, 1, 2]
    assert plain[0].config.hook_options.quantizer_options == {"bucket_size": 512, "clip": None}
    assert plain[0].config.warmup_steps == 0
    sign = variant("signsgd-b512", "clip")[0].config.hook_options.make_quantizer()
    assert (sign.bucket_size, sign.clip) == (512, 2.5)
    fp32 = [r for r in runs if r.method == "fp32"]
    assert len(fp32) == 6 and all(r.config.method.baseline == "fp32" for r in fp32)
    ps = [oq.exchange_of(r) for r in runs if "-ps" in r.config.method.name]
    assert ps == ["ps/coherent", "ps/requantize"] * 2
    # bits per element of one worker's message of LeNet's whole gradient
    bits = {r.method: oq.bits_per_element(r.config) for r in runs}
    assert bits["fp32"] == 32.0
    assert 1.0 < bits["bingrad-b"] < 1.2
    assert 1.6 < bits["terngrad-b512"] < 1.7


def test_comparisons_pair_the_seeds_when_both_methods_ran_them():
    def rec(method, seed, accuracy):
        return {"method": method, "variant": "clip", "exchange": "allgather", "seed": seed,
                "final_accuracy": accuracy}  # fmt: skip

    # a seed moves both methods by 0.5 points; a is 0.1 point better at every seed: real when
    # paired, lost in the seeds' spread when not
    records = [rec(m, s, 0.95 + 0.005 * s + (0.001 if m == "a" else 0)) for m in "ab"
               for s in range(3)]  # fmt: skip
    assert oq.compare(records, "a", "b", "clip").endswith("paired over 3 seeds; higher)")
    records = [r for r in records if not (r["method"] == "b" and r["seed"] == 2)]
    records.append(rec("b", 3, 0.965))
    assert "unpaired; within the noise" in oq.compare(records, "a", "b", "clip")
    records.append(rec("c", 0, 0.9))
    assert "one seed: no error bar" in oq.compare(records, "c", "a", "clip")
    assert oq.compare(records, "a", "d", "clip") is None
    assert oq.compare(records, "a", "b", "noclip") is None


def test_algorithm2_rows_are_set_beside_the_exact_average_of_the_same_seed():
    def rec(exchange, accuracy, sent):
        return {"method": "orq-5", "variant": "clip", "exchange": exchange, "seed": 0,
                "final_accuracy": accuracy, "bytes_per_step": sent}  # fmt: skip

    records = [rec("allgather", 0.95, 1000), rec("ps/coherent", 0.94, 3000)]
    assert oq._broadcasts(records, "clip") == [
        "Algorithm 2, orq-5 through ps/coherent: final 94.00% against 95.00% with the exact "
        "average (seed 0); the server sends 3,000 bytes a step (an allgather rank 1,000)"
    ]
    assert oq._broadcasts(records, "noclip") == []
