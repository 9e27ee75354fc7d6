"""One-process simulation of N = 4 ranks' AdamW variance estimators on gpt-small, without
compression (docs/results/gpt.md, "How the estimator was found"): each step draws 4
batches of 16 windows, one per simulated rank, and steps AdamW (lr 1e-3, weight decay 0.1 on
matrices, warm-up then cosine over TOTAL steps) along their mean gradient, with the variance

* A: AdamW's own, the running mean of the mean gradient's squares;
* B: the running mean of the ranks' own squares, mean_i g_i^2 (LocalVarianceAdamW uncorrected);
* C: B corrected, mean_i(v_i) / N + (1 - 1/N) m_hat^2 (LocalVarianceAdamW);

the denominator made anew at steps 1, 2, 4, ... below SYNC and every SYNC-th step. Prints the
validation bits per character every 100 steps and writes them to sim-<variant>-<sync>.json.

    python docs/results/transformer-small/variance_simulation.py A|B|C STEPS TOTAL SYNC
    # measured: A, B, C with 400 1000 1 (python3-doc installed)
"""
import sys, math, json, tempfile, time
import torch
from terngrad.train import setup, models, schedule
from terngrad.experiments import gpt
variant, steps, total, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
N, B = 4, 16
cfg = gpt.protocol(tempfile.mkdtemp(), model="gpt-small", steps=total)
data = setup.load_data(cfg, seed=0)
model = setup.build_model(cfg, data)
params = list(model.parameters())
decay = [0.1 if p.dim() >= 2 else 0.0 for p in params]
warm = schedule.warmup_length(cfg.warmup_steps, 0.0, 1)
factor = schedule.lr_factor("cosine", total, 0.5, warm)
b1, b2, eps, lr0 = 0.9, 0.999, 1e-8, 1e-3
m = [torch.zeros_like(p) for p in params]; v = [torch.zeros_like(p) for p in params]
d = [None] * len(params)
gen = torch.Generator().manual_seed(0)
def evaluate():
    model.eval(); tot = n = 0.0
    with torch.no_grad():
        for chunk in torch.arange(data.test_size).split(64):
            x, y = data.test_batch(chunk)
            tot += float(models.loss(model(x), y, reduction="sum")); n += y.numel()
    model.train(); return tot / n
out = []
t0 = time.time()
for step in range(steps):
    t = step + 1
    lr = lr0 * factor(step)
    grads = []
    for r in range(N):
        idx = torch.randint(0, data.train_size, (B,), generator=gen)
        x, y = data.train_batch(idx, gen)
        model.zero_grad()
        models.loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in params])
    with torch.no_grad():
        for k, p in enumerate(params):
            gs = torch.stack([grads[r][k] for r in range(N)])
            g = gs.mean(0)
            m[k].lerp_(g, 1 - b1)
            if variant == "A":
                v[k].mul_(b2).addcmul_(g, g, value=1 - b2)
            else:
                v[k].mul_(b2).add_((gs * gs).mean(0), alpha=1 - b2)
            due = (t & (t - 1) == 0) if t < sync else (t % sync == 0)
            if variant == "A" or due or d[k] is None:
                vh = v[k] / (1 - b2 ** t)
                if variant == "C":
                    mh = m[k] / (1 - b1 ** t)
                    vh = vh / N + (1 - 1 / N) * mh * mh
                d[k] = vh.sqrt() + eps
            p.mul_(1 - lr * decay[k])
            p.addcdiv_(m[k], d[k], value=-lr / (1 - b1 ** t))
    if t % 100 == 0:
        out.append((t, round(evaluate() / math.log(2), 4)))
        print(variant, sync, out[-1], f"{time.time()-t0:.0f}s", flush=True)
json.dump(out, open(f"sim-{variant}-{sync}.json", "w"))
