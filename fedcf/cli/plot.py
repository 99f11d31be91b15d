"""fedcf plot: a saved model's training history as a PNG."""

from __future__ import annotations

from pathlib import Path

from .common import SUMMARY, UsageError, _pyplot, output_path


def plot_history(model, out) -> Path:
    """PNG of a model's ``history_``: loss (and per-round evaluation) per round, clients used and
    dropped, values uploaded, learned hyperparameters if any; a centralized model's training
    RMSE (or loss, or seconds) per epoch."""
    import pandas as pd

    from ..datasets import atomic_write

    plt = _pyplot()
    hist = pd.DataFrame(model._fitted("history_") or [])
    if hist.empty:
        raise UsageError("the model has no training history to plot")
    if "round" not in hist:
        col = next((c for c in ("train_rmse", "loss", "seconds") if c in hist), None)
        if col is None or "epoch" not in hist:
            raise UsageError(f"the model's history has no per-epoch measure to plot (columns "
                             f"{sorted(hist.columns)})")
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(hist["epoch"] + 1, hist[col], marker="o")
        ax.set(xlabel="epoch", ylabel=col.replace("_", " "), title=type(model).__name__)
    else:
        learned = [c for c in ("server_learning_rate", "momentum", "weight_exponent")
                   if c in hist]
        fig, axes = plt.subplots(1, 3 + bool(learned), figsize=(13 + 4 * bool(learned), 3.5))
        x = hist["round"] + 1
        for col in learned:
            axes[3].plot(x, hist[col], lw=1, label=col.replace("_", " "))
        if learned:
            axes[3].set(xlabel="round", title="learned hyperparameters", yscale="log"
                        if "weight_exponent" not in learned else "linear")
            axes[3].legend()
        axes[0].plot(x, hist["loss"], lw=1, label="client query loss (MSE)")
        if "eval" in hist:
            ev = pd.DataFrame([e if isinstance(e, dict) else {} for e in hist["eval"]], index=x)
            for col in ev.columns:
                axes[0].plot(ev[col].dropna(), marker="o", label=f"validation {col}")
        axes[0].set(xlabel="round", title="loss and evaluation")
        axes[0].legend()
        axes[1].plot(x, hist["clients_used"], lw=1, label="used")
        axes[1].plot(x, hist["clients_dropped"], lw=1, label="dropped")
        axes[1].set(xlabel="round", title="clients per round")
        axes[1].legend()
        axes[2].plot(x, hist["values_up"], lw=1)
        axes[2].set(xlabel="round", title="values uploaded per round")
    fig.tight_layout()
    path = atomic_write(Path(out), lambda fh: fig.savefig(fh, format="png", dpi=110))
    plt.close(fig)
    return path


def cmd_plot(args):
    from .. import load_model

    model = load_model(args.model)
    out = output_path(args.out or str(Path(args.model).with_suffix("")) + "_history.png",
                      "--out")
    print(plot_history(model, out))


def add_parser(sub):
    p = sub.add_parser("plot", help=SUMMARY["plot"])
    p.add_argument("what", choices=("history",))
    p.add_argument("model")
    p.add_argument("--out", help="PNG path (default: <model>_history.png)")
    return p
