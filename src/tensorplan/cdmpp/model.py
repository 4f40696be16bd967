"""CDMPP latency predictor (EuroSys'24), re-implemented for tensorplan.

A tensor program is its compact AST: only the leaves (BufferStores) carry the
164-d Ansor per-store features (`cdmpp.features`). The model is

    leaves --min-max--> +PE(position) --Linear--> TransformerEncoder (key-padding mask)
           --masked mean|sum pooling [| summed/max-pooled leaves, option flat_skip]--> MLP_emb = z
    device features --MLP_dev--> zd ;  z = N0(z) + N0(zd)   (shared non-affine LayerNorm)
    z --MLP_reg--> r (tanh, the domain-alignment embedding) --Linear--> Box-Cox-standardised latency

trained with `w_mse*MSE(normalised) + w_mape*MAPE(seconds)` plus `alpha*CMD(r_src, r_tgt)`
towards unlabelled target-domain programs (§2.3-2.4 of reference/cdmpp.md).

Deviations from the released code, with reasons:
- padding + key-padding mask + pooling instead of one flatten layer per leaf count, so one model
  serves every program (reference §7.3);
- the MAPE term is computed on de-normalised seconds: on a standardised target it divides by
  values near 0 and is ill-defined;
- the embedding used for CMD ends in tanh, so its moments are bounded as CMD assumes (the reference
  uses unbounded ReLU features with a bound of 1);
- normalisers (features, target) are fitted on the training split only.

The pieces every latency model shares live beside it: the data view (`arrays`), analytic
estimates (`analytic`), metrics (`metrics`) and the `Estimator` face with its registry (`base`).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.analytic import fit_cache_ratio, hierarchy_seconds, roofline_seconds
from tensorplan.cdmpp.arrays import LEAF_DIM, FeatureScaler, ProgramArrays, as_arrays, device_features, labelled_latency
from tensorplan.cdmpp.base import Estimator, load_estimator, torch_threads
from tensorplan.cdmpp.metrics import regression_metrics
from tensorplan.cdmpp.tasks import TASK_IO_DIM

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SHIPPED_MODEL = WEIGHTS_DIR / "cdmpp-local.pt"


# --------------------------------------------------------------------------------------------
# Normalisers (fitted on the training split only)
# --------------------------------------------------------------------------------------------

@dataclass
class TargetTransform:
    """Latency (s) -> Box-Cox(latency in µs) -> standardised; `kind='log'` uses log instead.

    The inverse clips to the training range widened by half its width on each side: with λ < 0 the
    Box-Cox inverse diverges as λ·b+1 -> 0, and an untrained or extrapolating net must not answer
    "infinite latency".
    """

    kind: str = "boxcox"
    lam: float = 0.0
    mean: float = 0.0
    std: float = 1.0
    b_lo: float = -math.inf
    b_hi: float = math.inf

    @classmethod
    def fit(cls, latency_s: np.ndarray, kind: str = "boxcox") -> "TargetTransform":
        from scipy.stats import boxcox

        us = np.asarray(latency_s, np.float64) * 1e6
        if kind == "boxcox":
            _, lam = boxcox(us)
            lam = float(np.clip(lam, -1.0, 1.0))
        elif kind == "log":
            lam = 0.0
        else:
            raise TensorplanError(f"target transform '{kind}': use 'boxcox' or 'log'")
        t = cls(kind=kind, lam=lam)
        b = t._bc(us)
        t.mean, t.std = float(b.mean()), float(max(b.std(), 1e-9))
        w = float(b.max() - b.min())
        lo, hi = float(b.min()) - 0.5 * w, float(b.max()) + 0.5 * w
        if lam < 0:  # stay inside the domain of the inverse: lam*b + 1 > 0  <=>  b < -1/lam
            hi = min(hi, 0.999 * (-1.0 / lam))
        elif lam > 0:
            lo = max(lo, 0.999 * (-1.0 / lam))
        t.b_lo, t.b_hi = lo, hi
        return t

    def _bc(self, us):
        return np.log(us) if abs(self.lam) < 1e-12 else (np.power(us, self.lam) - 1.0) / self.lam

    def transform(self, latency_s: np.ndarray) -> np.ndarray:
        return ((self._bc(np.asarray(latency_s, np.float64) * 1e6) - self.mean) / self.std).astype(np.float32)

    def inverse(self, z: np.ndarray) -> np.ndarray:
        b = np.clip(np.asarray(z, np.float64) * self.std + self.mean, self.b_lo, self.b_hi)
        if abs(self.lam) < 1e-12:
            us = np.exp(b)
        else:
            us = np.power(np.maximum(self.lam * b + 1.0, 1e-12), 1.0 / self.lam)
        return us * 1e-6

    def inverse_torch(self, z):
        """Differentiable inverse, for the MAPE term of the loss (returns seconds)."""
        import torch

        b = torch.clamp(z.double() * self.std + self.mean, self.b_lo, self.b_hi)
        if abs(self.lam) < 1e-12:
            us = torch.exp(b)
        else:
            us = torch.clamp(self.lam * b + 1.0, min=1e-12) ** (1.0 / self.lam)
        return us * 1e-6

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lam": self.lam, "mean": self.mean, "std": self.std,
                "b_lo": self.b_lo, "b_hi": self.b_hi}

    @classmethod
    def from_dict(cls, d: dict) -> "TargetTransform":
        return cls(**d)


# --------------------------------------------------------------------------------------------
# CMD
# --------------------------------------------------------------------------------------------

def cmd(x, y, k: int = 5):
    """Central moment discrepancy between samples x [n,d] and y [m,d] (Zellinger et al.; §2.4).

    ||mean(x)-mean(y)|| + sum_{j=2..k} ||E[(x-mx)^j] - E[(y-my)^j]||, bound factor 1.
    """
    mx, my = x.mean(0), y.mean(0)
    sx, sy = x - mx, y - my
    d = (mx - my).norm()
    px, py = sx, sy
    for _ in range(2, k + 1):
        px, py = px * sx, py * sy
        d = d + (px.mean(0) - py.mean(0)).norm()
    return d


# --------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------

def sinusoidal_table(max_pos: int, dim: int = LEAF_DIM) -> np.ndarray:
    """Transformer sinusoidal PE table [max_pos, dim]; row p encodes pre-order position p."""
    try:  # the data helper's definition wins when present, so features and model agree
        from tensorplan.cdmpp.features import positional_encoding

        t = np.asarray(positional_encoding(np.arange(max_pos), dim), np.float32)
        if t.shape == (max_pos, dim):
            return t
    except Exception:
        pass
    pos = np.arange(max_pos)[:, None].astype(np.float64)
    i = np.arange(dim)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / dim)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def _build_net(leaf_dim: int, dev_dim: int, d_model: int, n_layers: int, n_heads: int, d_ff: int,
               dropout: float, emb_dim: int, hidden: int, max_pos: int, use_pe: bool, emb_norm: str = "layer",
               flat_skip: bool = False, io_dim: int = 0):
    import torch
    from torch import nn

    class CDMPPNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", torch.from_numpy(sinusoidal_table(max_pos, leaf_dim)))
            self.use_pe = use_pe
            self.embed = nn.Linear(leaf_dim, d_model)
            layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            # per-sample LayerNorm by default (no train/eval mismatch; equal to batch norm when measured)
            norm = nn.BatchNorm1d(hidden) if emb_norm == "batch" else nn.LayerNorm(hidden)
            self.flat_skip = flat_skip
            self.io_dim = io_dim
            n_in = 2 * d_model + (2 * leaf_dim + 1 if flat_skip else 0) + io_dim
            self.mlp_emb = nn.Sequential(nn.Linear(n_in, hidden), norm, nn.ReLU(),
                                         nn.Linear(hidden, emb_dim))
            self.mlp_dev = nn.Sequential(nn.Linear(dev_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                         nn.Linear(64, emb_dim))
            # shared non-affine normalisation of both branches, then add (reference: BatchNorm1d). Per
            # sample (LayerNorm), because a batch of one device has constant zd, which batch norm
            # maps to exactly 0 in training and to something else in eval mode.
            self.norm0 = nn.LayerNorm(emb_dim, elementwise_affine=False)
            self.mlp_reg = nn.Sequential(nn.Linear(emb_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                         nn.Tanh())
            self.head = nn.Linear(hidden, 1)

        def embedding(self, x, pos, valid, dev, layer: str = "r", io=None):
            """Returns r, the last hidden layer (where CMD aligns domains), or with layer="z" the
            program + device embedding that feeds the regressor. `io`: per-program inputs next to the
            pooled leaves, scaled by the caller (`CDMPP._io`; only when the net was built with io_dim > 0)."""
            vm = valid.unsqueeze(-1).to(x.dtype)
            cnt = vm.sum(1).clamp(min=1.0)
            flat = None
            if self.flat_skip:  # the program's summed and max-pooled leaf features, as TenSet sees it
                flat = torch.cat([(x * vm).sum(1) / 4.0, x.masked_fill(~valid.unsqueeze(-1), -1e4).amax(1),
                                  torch.log2(cnt)], dim=1)
            if self.use_pe:
                x = x + self.pe[pos.clamp(max=self.pe.shape[0] - 1)]
            x = x * vm                                   # padded leaves contribute nothing
            h = self.encoder(self.embed(x), src_key_padding_mask=~valid)
            h = h * vm
            s = h.sum(1)
            pooled = torch.cat([s / cnt, s / 8.0], dim=1)  # mean | scaled sum over valid leaves
            if flat is not None:
                pooled = torch.cat([pooled, flat], dim=1)
            if self.io_dim:
                pooled = torch.cat([pooled, io], dim=1)
            z = self.mlp_emb(pooled)
            z = self.norm0(z) + self.norm0(self.mlp_dev(dev))
            return z if layer == "z" else self.mlp_reg(z)

        def forward(self, x, pos, valid, dev, layer: str = "r", io=None):
            """(normalised prediction, the `layer` embedding)."""
            z = self.embedding(x, pos, valid, dev, layer="z", io=io)
            r = self.mlp_reg(z)
            return self.head(r).squeeze(-1), (z if layer == "z" else r)

    return CDMPPNet()


class CDMPP(Estimator):
    """CDMPP: Transformer over compact-AST leaves + device MLP, hybrid loss, optional CMD."""

    name = "cdmpp"
    adapts_by_finetune = True

    def __init__(self, d_model: int = 64, n_layers: int = 1, n_heads: int = 4, d_ff: int = 128,
                 dropout: float = 0.05, emb_dim: int = 64, hidden: int = 192, max_leaves: int = 64,
                 max_pos: int = 1024, use_pe: bool = True, target: str = "log", emb_norm: str = "layer",
                 flat_skip: bool = False, task_io: bool = False, base: str = "none", parts_input: bool = False,
                 lr: float = 1e-3, weight_decay: float = 1.307e-5, batch_size: int = 128,
                 epochs: int = 60, max_time_s: float | None = None, cycle_epochs: float = 10.0,
                 w_mse: float = 1.0, w_mape: float = 0.1, ape_cap: float = 1.0, w_rank: float = 0.0,
                 rank_group: int = 8, rank_temp: float = 0.25, cmd_alpha: float = 1.0, cmd_k: int = 5,
                 cmd_batch: int = 256, cmd_layer: str = "r", grad_clip: float = 2.0, finetune_steps: int = 300,
                 finetune_lr: float = 3e-4, finetune_scope: str = "head", seed: int = 0, threads: int | None = None,
                 verbose: bool = False):
        self.d_model, self.n_layers, self.n_heads, self.d_ff = d_model, n_layers, n_heads, d_ff
        self.dropout, self.emb_dim, self.hidden = dropout, emb_dim, hidden
        self.max_leaves, self.max_pos, self.use_pe, self.target = max_leaves, max_pos, use_pe, target
        if emb_norm not in ("batch", "layer"):
            raise TensorplanError(f"cdmpp: emb_norm must be 'batch' or 'layer', got {emb_norm!r}")
        self.emb_norm, self.flat_skip, self.task_io = emb_norm, flat_skip, task_io
        if base not in ("none", "roofline", "hierarchy"):
            raise TensorplanError(f"cdmpp: base must be 'none', 'roofline' or 'hierarchy', got {base!r}")
        self.base = base
        self.cache_ratio: float | None = None   # fitted on the training split (base="hierarchy")
        self.parts_input = parts_input
        self.parts_norm: tuple[list, list] | None = None  # mean, std of log hierarchy parts (training split)
        self.lr, self.weight_decay, self.batch_size, self.epochs = lr, weight_decay, batch_size, epochs
        self.max_time_s, self.cycle_epochs = max_time_s, cycle_epochs
        self.ape_cap = ape_cap
        if w_rank < 0 or rank_group < 2 or rank_temp <= 0:
            raise TensorplanError(f"cdmpp: need w_rank >= 0, rank_group >= 2 and rank_temp > 0, got "
                                  f"{w_rank}, {rank_group}, {rank_temp}")
        self.w_rank, self.rank_group, self.rank_temp = w_rank, rank_group, rank_temp
        self.w_mse, self.w_mape, self.cmd_alpha, self.cmd_k, self.cmd_batch = w_mse, w_mape, cmd_alpha, cmd_k, cmd_batch
        self.grad_clip, self.finetune_steps, self.finetune_lr = grad_clip, finetune_steps, finetune_lr
        if cmd_layer not in ("r", "z"):
            raise TensorplanError(f"cdmpp: cmd_layer must be 'r' (last hidden layer) or 'z' (program embedding), "
                                  f"got {cmd_layer!r}")
        self.cmd_layer = cmd_layer
        self.finetune_scope = finetune_scope
        self.seed, self.threads, self.verbose = seed, threads, verbose
        self.net = None
        self.scaler: FeatureScaler | None = None
        self.ytf: TargetTransform | None = None
        self.dev_dim: int | None = None
        self.history: list[dict] = []
        self.train_time_s: float = 0.0

    # ---------------------------------------------------------------- helpers
    def _tensors(self, arr: ProgramArrays, idx: np.ndarray):
        import torch

        x, p, v = arr.padded(idx, self.max_leaves)
        x = self.scaler.transform(x) * v[..., None]
        return (torch.from_numpy(x), torch.from_numpy(p), torch.from_numpy(v),
                torch.from_numpy(arr.device[idx]))

    @property
    def io_dim(self) -> int:
        return (TASK_IO_DIM if self.task_io else 0) + (3 if self.parts_input else 0)

    def _io(self, arr: ProgramArrays, idx: np.ndarray):
        """Per-program inputs beside the pooled leaves, or None.

        `task_io=True`: log2 buffer element counts of each record's task (/16). `parts_input=True`: the
        program's log compute, DRAM-footprint and cache-traffic seconds on its device (`hierarchy_parts`),
        standardised on the training split: the sums over stores that the Transformer's per-leaf
        attention does not form by itself, and the device's peak and bandwidth folded in.
        """
        if not self.io_dim:
            return None
        import torch
        cols = []
        if self.task_io:
            if arr.task_io is None:
                raise TensorplanError("cdmpp: this model reads the task's buffer sizes (task_io=True), but the "
                                      "records carry none; load them with `tensorplan.cdmpp.dataset.load_dataset`")
            cols.append(arr.task_io[idx, :TASK_IO_DIM] / 16.0)
        if self.parts_input:
            mean, std = (np.asarray(v) for v in self.parts_norm)
            cols.append((arr.log_hierarchy_parts[idx] - mean) / std)
        return torch.from_numpy(np.ascontiguousarray(np.hstack(cols), np.float32))

    def _base(self, arr: ProgramArrays) -> np.ndarray:
        """What the target is relative to: 1 s, or (`base="roofline"`) the program's roofline bound on
        its device, so the net learns an efficiency factor that carries over to kernel families and
        devices it has not seen (the bound scales with FLOPs, bytes, peak and bandwidth).
        `base="hierarchy"`: compute + DRAM footprint + cache traffic (`hierarchy_seconds`), with the
        cache-to-DRAM ratio fitted on the training split."""
        if self.base == "roofline":
            return roofline_seconds(arr)
        if self.base == "hierarchy":
            if self.cache_ratio is None:
                raise TensorplanError("cdmpp: base='hierarchy' but no cache ratio was fitted; train the model first")
            return hierarchy_seconds(arr.cached_hierarchy_parts, self.cache_ratio)
        return np.ones(len(arr))

    def _check_dev(self, arr: ProgramArrays):
        if arr.device.shape[1] != self.dev_dim:
            raise TensorplanError(f"device feature width {arr.device.shape[1]} != model's {self.dev_dim}")

    def _loss(self, pred, y_norm, y_s, base_s=1.0):
        import torch

        mse = torch.mean((pred - y_norm) ** 2)
        if self.w_mape:
            p_s = self.ytf.inverse_torch(pred) * base_s
            # APE capped at `ape_cap`: an over-prediction by 100x must not outweigh everything else
            # (MSE in the normalised space already pulls such outliers in)
            mape = torch.mean(torch.clamp(torch.abs(p_s - y_s) / y_s, max=self.ape_cap)).float()
            return self.w_mse * mse + self.w_mape * mape
        return self.w_mse * mse

    def _rank_loss(self, pred, y_s, base_s, piece):
        """Pairwise (RankNet) loss over programs of one (task, device) `piece` of the batch.

        Why: MSE over all records is mostly spent on the spread *between* tasks (latencies span
        five decades); the spread between schedules of one task, which decides what a tuner picks,
        is a small part of it. Each pair's logistic loss is on the difference of predicted log
        seconds over `rank_temp`, weighted by the measured log ratio (capped at 1), so near-ties
        (under 5 %, inside the timer's noise) count for nothing and clear orderings most.
        """
        import torch

        logp = torch.log(self.ytf.inverse_torch(pred) * base_s)
        logy = torch.log(y_s)
        same = piece[:, None] == piece[None, :]
        dy = logy[:, None] - logy[None, :]
        w = torch.where(same & (dy > 0.05), torch.clamp(dy, max=1.0), torch.zeros_like(dy))
        if float(w.sum()) == 0.0:
            return pred.sum() * 0.0
        dp = (logp[:, None] - logp[None, :]) / self.rank_temp  # should be > 0 where dy > 0
        return (torch.nn.functional.softplus(-dp) * w).sum() / w.sum()

    def _ranked_batches(self, codes: np.ndarray, rng, bs: int) -> list[np.ndarray]:
        """One epoch of batches built from `rank_group`-program pieces of one (task, device) each
        (`codes`: each record's group), so every batch holds within-task pairs for `_rank_loss`;
        every record still appears once."""
        perm = rng.permutation(len(codes))
        perm = perm[np.argsort(codes[perm], kind="stable")]           # shuffled within each group
        cuts = np.flatnonzero(np.diff(codes[perm])) + 1
        pieces = [c for g in np.split(perm, cuts) for c in np.array_split(g, max(1, len(g) // self.rank_group))]
        chunks = np.array_split(rng.permutation(len(pieces)), max(1, len(pieces) * self.rank_group // bs))
        return [np.concatenate([pieces[j] for j in c]) for c in chunks]

    # ---------------------------------------------------------------- fit
    def fit(self, train, val=None, target=None) -> "CDMPP":
        """Fit normalisers on `train`, then train; `target` (unlabelled) enables CMD."""
        with torch_threads(self.threads):
            return self._fit(train, val, target)

    def _fit(self, train, val, target) -> "CDMPP":
        import torch

        t0 = time.perf_counter()
        tr = as_arrays(train)
        y = labelled_latency(tr, "cdmpp.fit")
        torch.manual_seed(self.seed)
        self.scaler = FeatureScaler.fit(tr.leaf_data)
        if self.base == "hierarchy":
            self.cache_ratio = fit_cache_ratio(tr.cached_hierarchy_parts, y, tr.task_key)
        self.ytf = TargetTransform.fit(y / self._base(tr), self.target)
        if self.parts_input:
            lp = tr.log_hierarchy_parts
            self.parts_norm = (lp.mean(0).tolist(), np.maximum(lp.std(0), 1e-6).tolist())
        self.dev_dim = tr.device.shape[1]
        self.net = _build_net(LEAF_DIM, self.dev_dim, self.d_model, self.n_layers, self.n_heads, self.d_ff,
                              self.dropout, self.emb_dim, self.hidden, self.max_pos, self.use_pe, self.emb_norm,
                              self.flat_skip, self.io_dim)
        steps_per_epoch = max(1, math.ceil(len(tr) / self.batch_size))
        self._train_loop(tr, val=as_arrays(val) if val is not None else None,
                         target=as_arrays(target) if target is not None else None,
                         lr=self.lr, total_steps=steps_per_epoch * self.epochs,
                         cycle_steps=max(2, int(self.cycle_epochs * steps_per_epoch)),
                         max_time_s=self.max_time_s, eval_every=steps_per_epoch, batch_size=self.batch_size)
        self.train_time_s = time.perf_counter() - t0
        return self

    def finetune(self, data, base=None, steps: int | None = None, target=None) -> "CDMPP":
        """Few-shot adaptation: keep normalisers, train a few steps on `data`.

        `finetune_scope="head"` (default) trains only what follows the program embedding (device MLP,
        regressor, head): a device change moves latencies, not program structure, and a few dozen
        samples overfit the encoder. "all" trains every weight. `base` (the source training set), when
        given, is replayed: half of every batch comes from it, so a few dozen target samples adapt the
        model without erasing what the source taught it. CMD is off while fine-tuning (`target` is
        accepted and ignored): the labelled samples and the pool are the same domain, and aligning a
        few dozen embeddings with the whole pool distorts them.
        """
        if self.net is None:
            raise TensorplanError("cdmpp.finetune: the model is not trained (fit or load it first)")
        ft = as_arrays(data)
        labelled_latency(ft, "cdmpp.finetune")
        self._check_dev(ft)
        steps = steps or self.finetune_steps
        bs = min(self.batch_size, len(ft))
        if self.finetune_scope not in ("head", "all"):
            raise TensorplanError(f"cdmpp: finetune_scope must be 'head' or 'all', got {self.finetune_scope!r}")
        frozen = [] if self.finetune_scope == "all" else [
            p for mod in (self.net.embed, self.net.encoder, self.net.mlp_emb) for p in mod.parameters()]
        for p in frozen:
            p.requires_grad_(False)
        try:
            with torch_threads(self.threads):
                if base is not None:
                    b = as_arrays(base)
                    both = ProgramArrays.concat([ft, b])
                    w = np.concatenate([np.full(len(ft), 0.5 / len(ft)), np.full(len(b), 0.5 / len(b))])
                    self._train_loop(both, val=None, target=None, lr=self.finetune_lr, total_steps=steps,
                                     cycle_steps=max(2, steps // 2), max_time_s=None, eval_every=None,
                                     batch_size=min(self.batch_size, 2 * len(ft)), weights=w)
                else:
                    self._train_loop(ft, val=None, target=None, lr=self.finetune_lr, total_steps=steps,
                                     cycle_steps=max(2, steps // 2), max_time_s=None, eval_every=None,
                                     batch_size=bs)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return self

    def _train_loop(self, tr: ProgramArrays, val, target, lr, total_steps, cycle_steps, max_time_s,
                    eval_every, batch_size, weights: np.ndarray | None = None):
        import torch

        net = self.net
        rng = np.random.default_rng(self.seed)
        opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=lr,
                               weight_decay=self.weight_decay)
        # CyclicLR as in §2.5 (base lr/10 .. max lr, triangular, stepped every batch)
        sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=lr / 10, max_lr=lr, step_size_up=cycle_steps // 2,
                                                  mode="triangular", cycle_momentum=False)
        base = np.asarray(self._base(tr), np.float64)
        base_all = torch.from_numpy(base)
        y_norm_all = torch.from_numpy(np.array(self.ytf.transform(tr.latency_s / base)))
        y_s_all = torch.from_numpy(np.array(tr.latency_s, np.float64))
        use_cmd = target is not None and len(target) > 1 and self.cmd_alpha > 0
        if use_cmd:
            self._check_dev(target)
        if self.w_rank:   # which (task, device) each record belongs to, for the ranking pairs
            grp = np.unique(tr.task_domains(), return_inverse=True)[1]
        best, best_state = math.inf, None
        t0, step, batches = time.perf_counter(), 0, []
        bs = max(2, min(batch_size, len(tr)))
        while step < total_steps:
            if weights is not None:  # weighted sampling (fine-tuning with replay)
                idx = rng.choice(len(tr), size=bs, replace=True, p=weights)
            else:
                if not batches:  # a new epoch: shuffled, near-equal batches (none too small for a norm layer)
                    batches = (self._ranked_batches(grp, rng, bs) if self.w_rank else
                               np.array_split(rng.permutation(len(tr)), max(1, len(tr) // bs)))
                idx = batches.pop()
            net.train()
            x, p, v, d = self._tensors(tr, idx)
            pred, r = net(x, p, v, d, self.cmd_layer, self._io(tr, idx))
            it = torch.from_numpy(idx)
            loss = self._loss(pred, y_norm_all[it], y_s_all[it], base_all[it])
            if self.w_rank and weights is None:
                loss = loss + self.w_rank * self._rank_loss(pred, y_s_all[it], base_all[it],
                                                             torch.from_numpy(grp[idx]))
            dval = 0.0
            if use_cmd:
                tidx = rng.choice(len(target), size=min(self.cmd_batch, len(target)), replace=False)
                xt, pt, vt, dt = self._tensors(target, tidx)
                _, rt = net(xt, pt, vt, dt, self.cmd_layer, self._io(target, tidx))
                dist = cmd(r, rt, self.cmd_k)
                loss = loss + self.cmd_alpha * dist
                dval = float(dist.detach())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.grad_clip)
            opt.step()
            sched.step()
            step += 1
            if eval_every and (step % eval_every == 0 or step == total_steps):
                rec = {"step": step, "loss": float(loss.detach()), "cmd": dval, "time_s": time.perf_counter() - t0}
                if val is not None and len(val):
                    # model selection on the symmetric log error: selecting on MAPE rewards models
                    # that under-predict everything (APE <= 1 below, unbounded above)
                    vmet = regression_metrics(self.predict(val), val.latency_s)
                    vm = vmet["mean_abs_log_ratio"]
                    rec["val_mape_pct"] = vmet["mape_pct"]
                    rec["val_log_err"] = vm
                    if vm < best:
                        best = vm
                        best_state = {k: t.detach().clone() for k, t in net.state_dict().items()}
                self.history.append(rec)
                if self.verbose:
                    print(rec, flush=True)
            if max_time_s is not None and time.perf_counter() - t0 > max_time_s:
                break
        if best_state is not None:
            net.load_state_dict(best_state)
        net.eval()

    # ---------------------------------------------------------------- predict
    def embed(self, records, batch: int = 4096) -> np.ndarray:
        """Last-hidden-layer embeddings r (the CMD space), [N, hidden]."""
        return self._run(records, batch, want_embedding=True)

    def predict(self, records, batch: int = 4096) -> np.ndarray:
        """Predicted latency in seconds for every program in `records`."""
        z = self._run(records, batch, want_embedding=False)
        return self.ytf.inverse(z) * self._base(as_arrays(records))

    def _run(self, records, batch, want_embedding):
        import torch

        if self.net is None:
            raise TensorplanError("cdmpp: the model is not trained (fit or load it first)")
        arr = as_arrays(records)
        self._check_dev(arr)
        self.net.eval()
        n = len(arr)
        order = np.argsort(arr.n_leaves, kind="stable")  # similar lengths share a batch: less padding
        out = np.empty((n, self.hidden) if want_embedding else n, np.float32)
        with torch.inference_mode(), torch_threads(self.threads):
            for s in range(0, n, batch):
                idx = order[s:s + batch]
                pred, r = self.net(*self._tensors(arr, idx), "r", self._io(arr, idx))
                out[idx] = (r if want_embedding else pred).numpy()
        return out

    # ---------------------------------------------------------------- state
    def normalisers(self) -> dict:
        nm = {"features": self.scaler.to_dict(), "target": self.ytf.to_dict(), "dev_dim": self.dev_dim}
        if self.cache_ratio is not None:
            nm["cache_ratio"] = self.cache_ratio
        if self.parts_norm is not None:
            nm["parts_norm"] = self.parts_norm
        return nm

    def _state(self):
        if self.net is None:
            raise TensorplanError("cdmpp.save: the model is not trained")
        return {"net": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
                "normalisers": self.normalisers(), "history": self.history, "train_time_s": self.train_time_s}

    def _set_state(self, st):
        nm = st["normalisers"]
        self.scaler = FeatureScaler.from_dict(nm["features"])
        self.ytf = TargetTransform.from_dict(nm["target"])
        self.dev_dim = int(nm["dev_dim"])
        self.cache_ratio = float(nm["cache_ratio"]) if "cache_ratio" in nm else None
        self.parts_norm = nm.get("parts_norm")
        self.net = _build_net(LEAF_DIM, self.dev_dim, self.d_model, self.n_layers, self.n_heads, self.d_ff,
                              self.dropout, self.emb_dim, self.hidden, self.max_pos, self.use_pe, self.emb_norm,
                              self.flat_skip, self.io_dim)
        try:
            self.net.load_state_dict(st["net"])
        except RuntimeError as e:
            first = str(e).strip().splitlines()[:2]
            raise TensorplanError("cdmpp: the saved weights do not fit this version's network (saved by an older "
                                  f"tensorplan?); retrain with `tensorplan predictor train`. {' '.join(first)}") from None
        self.net.eval()
        self.history = list(st.get("history", []))
        self.train_time_s = float(st.get("train_time_s", 0.0))

    def save(self, path: str | Path) -> Path:
        """Save weights (.pt) and, next to it, the normalisers as readable JSON (`<name>.norm.json`)."""
        path = super().save(path)
        path.with_suffix(".norm.json").write_text(json.dumps(self.normalisers(), indent=1))
        return path


def load_shipped() -> Estimator:
    """The model trained on this machine's domains and shipped with the package."""
    if not SHIPPED_MODEL.exists():
        raise TensorplanError(f"shipped model '{SHIPPED_MODEL}' is missing; run `tensorplan predictor train --ship`")
    return load_estimator(SHIPPED_MODEL)   # a CDMPP or an ensemble of them (`train --members`)


# --------------------------------------------------------------------------------------------
# Python API behind the CLI
# --------------------------------------------------------------------------------------------

def resolve_domain(device: str) -> str:
    """'local' means this CPU with every core this process may use: the domain `local-<n>t`, as
    `predict` names it (a model that never learnt that many threads treats it as a new device)."""
    if device == "local":
        from tensorplan.devices import usable_cores

        return f"local-{usable_cores()}t"
    return device


def _history(model: Estimator) -> list:
    """The per-epoch training history of `model`, or of the model it wraps (`model.base`); [] if none."""
    while not hasattr(model, "history") and isinstance(getattr(model, "base", None), Estimator):
        model = model.base
    return list(getattr(model, "history", None) or [])


def train(data=None, *, devices: Sequence[str] | None = None, out: str | Path | None = None,
          max_cov: float = 0.01, stability: str = "mad", log=None, members: int = 1,
          make: Callable[[int], Estimator] | None = None, workers: int = 1,
          **params) -> tuple[Estimator, dict]:
    """Train CDMPP on every stable record of `devices` (default: all) of a dataset; save to `out`.

    Stability: repeat spread <= max_cov, measured as MAD/median by default (`stability="mad"`): on a
    shared machine one preempted repeat inflates the CoV of an otherwise well-measured program.
    `members > 1` trains an `ensemble.Ensemble` of that many seeds (each with the full budget).
    `make(seed)` builds another estimator instead of CDMPP(**params) (e.g. a baseline from
    `evaluate.make_model`); `params` are then not used. `workers` > 1 trains that
    many ensemble members at once (`Ensemble.fit`, spawned processes: a script calling this needs
    the `if __name__ == "__main__":` guard)."""
    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(data) if data is None or isinstance(data, (str, Path)) else data
    if devices:
        ds = ds.only_devices(devices)
    ds = ds.filter_stable(max_cov=max_cov, metric=stability)
    if len(ds) == 0:
        raise TensorplanError(f"train: no stable records for devices {devices or 'any'} in '{ds.path}'")
    arr = as_arrays(ds)
    seed = params.get("seed", 0)
    rng = np.random.default_rng(seed)
    val_m = rng.random(len(arr)) < 0.05
    build = make or (lambda s: CDMPP(**{**params, "seed": s}))
    if members > 1:
        from tensorplan.cdmpp.ensemble import Ensemble

        model = Ensemble.of(build, members, seed=seed)
    else:
        model = build(seed)
    t0 = time.perf_counter()
    if members > 1:
        model.fit(arr.subset(np.flatnonzero(~val_m)), val=arr.subset(np.flatnonzero(val_m)), workers=workers)
        parts = model.members          # after fitting: members fitted side by side come back as new objects
    else:
        model.fit(arr.subset(np.flatnonzero(~val_m)), val=arr.subset(np.flatnonzero(val_m)))
        parts = [model]
    val = arr.subset(np.flatnonzero(val_m))
    model.domains_ = sorted(set(arr.device_name))  # saved with it: `predict` says when a device is not among them
    model.domain_features_ = {d: device_features(d, ds.devices).tolist() for d in model.domains_}
    epochs = [len(_history(m)) for m in parts]
    info = {"records": len(arr), "stability": f"{stability} <= {max_cov}", "devices": sorted(set(arr.device_name)),
            "model": type(parts[0]).__name__, "members": len(parts),
            "train_time_s": time.perf_counter() - t0,
            "val": regression_metrics(model.predict(val), val.latency_s),
            "epochs_run": epochs if members > 1 else epochs[0]}
    if out is not None:
        p = model.save(out)
        info["path"] = str(p)
        info["size_mb"] = p.stat().st_size / 1e6
    return model, info
