"""The ``fedcf`` command line: train → recommend → evaluate → plot for every model, and bad input
→ one line on stderr, exit code 2, no traceback, no output file."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcf import load_model
from fedcf.cli import main, read_table
from fedcf.cli.common import is_implicit
from fedcf.datasets import make_synthetic_ratings
from fedcf.model_selection import PerUserSplit

FAST = {"fedrecon": ["--rounds", "8"], "fedavg": ["--rounds", "8"], "furl": ["--rounds", "8"],
        "fedrecon-implicit": ["--rounds", "8"], "centralized": ["--epochs", "3"],
        "implicit": ["--epochs", "3"], "fedmf": ["--rounds", "8"], "pfedrec": ["--rounds", "8"],
        "fedncf": ["--rounds", "8", "--set", "layers=[4]"],
        "ncf": ["--epochs", "2", "--set", "layers=[4]"]}


def test_the_cli_trains_every_registered_estimator():
    from fedcf import registry

    assert sorted(FAST) == registry.names("estimator")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    df = make_synthetic_ratings(200, 80, 5000, n_factors=3, random_state=2).to_dataframe()
    users = df.user.unique()
    held = df.user.isin(users[:30])
    df[~held].to_csv(root / "train.csv", index=False)
    df[held].to_csv(root / "test.csv", index=False)
    train = df[~held]
    tr, te = next(PerUserSplit(test_size=0.2, order="time").split(train))
    train.iloc[tr].to_csv(root / "hist.csv", index=False)
    train.iloc[te].to_csv(root / "later.csv", index=False)
    return root


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("model", sorted(FAST))
def test_train_recommend_evaluate_plot(model, files, capsys, tmp_path):
    out = tmp_path / "m.npz"
    code, _, err = run(["train", "--data", str(files / "hist.csv"), "--model", model, "--out",
                        str(out), "--factors", "3", "--seed", "0", "-q", *FAST[model]], capsys)
    assert code == 0, err
    fitted = load_model(out)
    implicit = is_implicit(fitted)
    ratings = [] if implicit else ["--ratings", "5", "4", "1"]
    items = [str(i) for i in fitted.item_ids_[:3]]
    code, text, err = run(["recommend", "--model", str(out), "--items", *items, *ratings, "-n",
                           "4", "--json"], capsys)
    assert code == 0, err
    recs = json.loads(text)
    assert [r["rank"] for r in recs] == [1, 2, 3, 4]
    assert not {r["item"] for r in recs} & set(fitted.item_ids_[:3].tolist())
    expect = fitted.recommend(items=fitted.item_ids_[:3], ratings=None if implicit else
                              [5, 4, 1], n=4)
    assert [r["item"] for r in recs] == expect["item"].tolist()
    for protocol in ("recon", "standard"):
        code, text, err = run(["evaluate", "--model", str(out), "--data",
                               str(files / ("test.csv" if protocol == "recon" else "later.csv")),
                               "--protocol", protocol, "--history", str(files / "hist.csv"),
                               "--json"], capsys)
        if model == "pfedrec" and protocol == "standard":  # its users' scores need fit data
            assert code == 2 and "a model loaded from disk does not hold" in err, err
            continue
        assert code == 0, err
        res = json.loads(text)
        key = "ndcg@10" if implicit else "rmse"
        assert 0 < res[key] < (1.0001 if implicit else 3) and res["users"] > 0
    png = tmp_path / "h.png"
    code, _, err = run(["plot", "history", str(out), "--out", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_with_validation_records_evaluation(files, capsys, tmp_path):
    out = tmp_path / "m.npz"
    code, _, err = run(["train", "--data", str(files / "train.csv"), "--model", "fedrecon",
                        "--out", str(out), "--rounds", "10", "--set", "eval_every=5",
                        "n_factors=3", "--validation", str(files / "test.csv"), "--plot",
                        str(tmp_path / "p.png")], capsys)
    assert code == 0, err
    evals = [h["eval"]["rmse"] for h in load_model(out).history_ if "eval" in h]
    assert len(evals) == 2 and all(0.3 < e < 3 for e in evals)
    assert "wrote" in err and (tmp_path / "p.png").exists()


def test_plot_shows_learned_hyperparameters(files, capsys, tmp_path):
    out = tmp_path / "m.npz"
    code, _, err = run(["train", "--data", str(files / "train.csv"), "--model", "fedrecon",
                        "--out", str(out), "--rounds", "6", "--factors", "2", "--set",
                        "hypergradients=default", "--plot",
                        str(tmp_path / "p.png")], capsys)
    assert code == 0, err
    assert len({h["server_learning_rate"] for h in load_model(out).history_}) > 1
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_matches_the_python_api(files, capsys, tmp_path):
    from fedcf.datasets import Interactions
    from fedcf.eval import recon_eval

    out = tmp_path / "m.npz"
    assert run(["train", "--data", str(files / "train.csv"), "--model", "fedrecon", "--out",
                str(out), "--rounds", "8", "-q"], capsys)[0] == 0
    code, text, _ = run(["evaluate", "--model", str(out), "--data", str(files / "test.csv"),
                         "--seed", "3", "--json"], capsys)
    ref = recon_eval(load_model(out), Interactions.coerce(pd.read_csv(files / "test.csv")),
                     n_repeats=2, random_state=3)
    assert json.loads(text)["rmse"] == pytest.approx(ref["rmse"])
    code, text, _ = run(["evaluate", "--model", str(out), "--data", str(files / "test.csv")],
                        capsys)
    assert code == 0 and "rmse" in text and "accuracy" in text


def test_read_table_columns_and_formats(tmp_path):
    p = tmp_path / "r.tsv"
    pd.DataFrame({"uid": [1, 2], "iid": ["a", "b"], "stars": [4, 5]}).to_csv(p, sep="\t",
                                                                          index=False)
    df = read_table(p, user_col="uid", item_col="iid", rating_col="stars")
    assert list(df.columns) == ["user", "item", "rating"] and df.item.tolist() == ["a", "b"]
    ml = tmp_path / "ratings.csv"
    pd.DataFrame({"userId": [1], "movieId": [7], "rating": [3.5], "timestamp": [9]}).to_csv(
        ml, index=False)
    assert list(read_table(ml).columns) == ["user", "item", "rating", "timestamp"]
    assert list(read_table(ml, rating_col="none").columns) == ["user", "item", "timestamp"]
    u = tmp_path / "u.data"
    u.write_text("1\t2\t3\t4\n2\t2\t5\t6\n")
    assert read_table(u).shape == (2, 4)


BAD = [
    (["train", "--data", "{d}/nope.csv", "--model", "fedrecon", "--out", "{o}"], "does not exist"),
    (["train", "--data", "{d}/train.csv", "--model", "svd", "--out", "{o}"], "invalid choice"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "n_factors=-1"], "n_factors must be"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "colour=3"], "unknown hyperparameter 'colour'"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "n_factors"], "key=value"),
    (["train", "--data", "{d}/train.csv", "--model", "centralized", "--out", "{o}", "--rounds",
      "3"], "unknown hyperparameter 'n_rounds'"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--rounds",
      "x"], "invalid int"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{d}/no/m.npz"],
     "does not exist"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--user-col",
      "uid"], "column 'uid'"),
    (["train", "--data", "{d}/nan.csv", "--model", "fedrecon", "--out", "{o}"], "non-finite"),
    (["train", "--data", "{d}/empty.csv", "--model", "fedrecon", "--out", "{o}"], "cannot read"),
    (["train", "--data", "{d}/dup.csv", "--model", "fedrecon", "--out", "{o}"], "duplicate"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--rounds",
      "20", "--set", "client_update__learning_rate=1e9"], "diverged"),
    (["train", "--data", "{d}/train.csv", "--model", "centralized", "--out", "{o}",
      "--validation", "{d}/test.csv"], "federated rounds"),
    (["evaluate", "--model", "{d}/garbage.npz", "--data", "{d}/test.csv"], "not a readable"),
    (["evaluate", "--model", "{d}/none.npz", "--data", "{d}/test.csv"], "does not exist"),
    (["evaluate", "--model", "{m}", "--data", "{d}/pairs.csv"], "no rating column"),
    (["evaluate", "--model", "{m}", "--data", "{d}/test.csv", "--protocol", "standard"],
     "--history"),
    (["recommend", "--model", "{m}", "--items", "99999", "--ratings", "5"], "not in this model"),
    (["recommend", "--model", "{m}", "--items", "1", "2", "--ratings", "5"], "2 ids but"),
    (["recommend", "--model", "{m}", "--items", "abc", "--ratings", "5"], "integers"),
    (["recommend", "--model", "{m}", "--items", "1"], "needs --ratings"),
    (["recommend", "--model", "{m}", "--user", "{u}"], "without its training user ids"),
    (["recommend", "--model", "{m}"], "either --items"),
    (["recommend", "--model", "{m}", "--items", "1", "--ratings", "nan"], "non-finite"),
    (["recommend", "--model", "{m}", "--items", "1", "--ratings", "5", "-n", "-2"], "n must"),
    (["recommend", "--model", "{m}", "--items", "1", "--ratings", "5", "-n", "0"], "n must"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{d}/m.csv"],
     "written as one .npz file; name it"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--rounds",
      "0"], "untrained model"),
    (["evaluate", "--model", "{d}/train.csv", "--data", "{d}/test.csv"],
     "a model file is a .npz (zip) archive"),
    (["evaluate", "--model", "{m}", "--data", "{d}/unknown.csv"],
     "names an item the model knows"),
    (["benchmark", "movielens", "--bogus"], "unrecognized arguments"),
    (["benchmark", "nothere"], "invalid choice"),
    (["data", "verify", "1m", "--data-home", "{d}/cache"], "not in the cache"),
    (["data", "fetch", "100k", "--path", "{d}/empty.csv", "--data-home", "{d}/cache"],
     "empty.csv is empty"),
    (["plot", "history", "{d}/garbage.npz"], "not a readable"),
    (["data", "split", "--data", "{d}/train.csv", "--train", "{o}"], "needs --data"),
    (["data", "split", "--data", "{d}/train.csv", "--train", "{o}", "--test", "{d}/t.csv",
      "--test-size", "1.5"], "test_size"),
    (["plot", "histogram", "{m}"], "invalid choice"),
    (["data", "split", "--data", "{d}/train.csv", "--train", "{d}/no/a.csv", "--test",
      "{d}/t.csv"], "folder"),
    (["data", "split", "--data", "{d}/train.csv", "--train", "{d}/t.csv", "--test",
      "{d}/t.csv"], "same file"),
    (["plot", "history", "{m}", "--out", "{d}/no/p.png"], "does not exist; create it first"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--plot",
      "{d}/no/p.png"], "--plot"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{d}"], "is a folder"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--factors",
      "-1"], "--factors -1: n_factors must be"),
    (["data", "split", "--data", "{d}/train.csv", "--train", "{o}", "--test", "{d}/t.csv",
      "--test-size", "0"], "--test-size 0: test_size must be"),
    (["train", "--data", "{d}/dup.csv", "--model", "fedrecon", "--out", "{o}"],
     "at rows 0 (line 2 of dup.csv) and 1 (line 3 of dup.csv); pass --duplicates last or "
     "--duplicates mean"),
    (["train", "--data", "{d}/blank.csv", "--model", "fedrecon", "--out", "{o}"],
     "at row 2 (line 5 of blank.csv)"),
    # a malformed JSON phase, a checkpoint folder that is not there, two flags for one
    # parameter, a bad --set value named by --set, a bad bool, k = 0, more negatives than items
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      'aggregator=[["median"'], "--set aggregator=[[\"median\": not valid JSON"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "checkpoint_path={d}/no/ck.npz"], "does not exist; create it or choose another "
     "checkpoint_path"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--factors",
      "4", "--set", "n_factors=abc"], "--factors and --set n_factors=... both set n_factors"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "n_factors=abc"], "--set n_factors=abc: n_factors must be an integer"),
    (["train", "--data", "{d}/train.csv", "--model", "fedrecon", "--out", "{o}", "--set",
      "verbose=maybe"], "verbose must be True or False"),
    (["evaluate", "--model", "{m}", "--data", "{d}/test.csv", "-k", "0"], "-k/--k: 0 is below 1"),
    (["train", "--data", "{d}/train.csv", "--model", "fedmf", "--out", "{o}", "--set",
      "negatives=1000"], "negatives=1000 per positive, but the catalog has only 80 items"),
]


@pytest.fixture(scope="module")
def bad_setup(files):
    (files / "nan.csv").write_text("user,item,rating\n1,2,\n")
    (files / "empty.csv").write_text("")
    (files / "dup.csv").write_text("user,item,rating\n1,2,3\n1,2,4\n")
    (files / "garbage.npz").write_text("garbage")
    (files / "blank.csv").write_text("user,item,rating\n1,2,3\n\n1,3,4\n2,2,inf\n")
    (files / "unknown.csv").write_text("user,item,rating\n" + "".join(
        f"{u},{90000 + j},{1 + j % 5}\n" for u in range(4) for j in range(6)))
    pd.read_csv(files / "test.csv")[["user", "item"]].to_csv(files / "pairs.csv", index=False)
    model = files / "model.npz"
    assert main(["train", "--data", str(files / "train.csv"), "--model", "fedrecon", "--out",
                 str(model), "--rounds", "5", "-q"]) == 0
    return files, model


@pytest.mark.parametrize("argv, match", BAD, ids=[" ".join(a[:2]) + f" [{m}]" for a, m in BAD])
def test_bad_input_one_line_exit_2_no_file(argv, match, bad_setup, capsys, tmp_path):
    folder, model = bad_setup
    out = tmp_path / "out.npz"
    user = pd.read_csv(folder / "train.csv").user.iloc[0]
    argv = [a.format(d=folder, o=out, m=model, u=user) for a in argv]
    with pytest.raises(SystemExit) as exc_info:  # argparse exits; commands return 2
        raise SystemExit(main(argv))
    _, err = capsys.readouterr()
    assert exc_info.value.code == 2
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()
             and not ln.startswith(("FedReconMF", "note: compiling"))]
    assert len(lines) == 1 and match in lines[0], err
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_failed_train_keeps_the_previous_model(bad_setup, capsys):
    folder, model = bad_setup
    before = model.read_bytes()
    code = main(["train", "--data", str(folder / "nan.csv"), "--model", "fedrecon", "--out",
                 str(model)])
    assert code == 2 and model.read_bytes() == before


def test_data_fetch_from_a_local_copy_then_verify_and_where(tmp_path, capsys):
    src = tmp_path / "ratings.csv"
    pd.DataFrame({"userId": [1, 1, 2], "movieId": [3, 4, 3], "rating": [4.0, 3.5, 5.0],
                  "timestamp": [1, 2, 3]}).to_csv(src, index=False)
    home = str(tmp_path / "cache")
    code, text, err = run(["data", "fetch", "latest-small", "--path", str(src), "--data-home",
                           home], capsys)
    assert code == 0, err
    code, text, err = run(["data", "verify", "latest-small", "--data-home", home, "--json"],
                          capsys)
    info = json.loads(text)
    assert code == 0 and info["ratings"] == 3 and len(info["sha256"]) == 64
    code, text, _ = run(["data", "where", "--data-home", home], capsys)
    assert "latest-small: ratings.csv" in text and "100k: (not cached)" in text


def test_data_split_by_users_and_rows(files, capsys, tmp_path):
    tr, te = tmp_path / "tr.csv", tmp_path / "te.csv"
    code, _, err = run(["data", "split", "--data", str(files / "train.csv"), "--train", str(tr),
                        "--test", str(te), "--test-size", "0.2", "--seed", "1"], capsys)
    assert code == 0, err
    a, b = pd.read_csv(tr), pd.read_csv(te)
    full = pd.read_csv(files / "train.csv")
    assert len(a) + len(b) == len(full) and not set(a.user) & set(b.user)
    code, _, err = run(["data", "split", "--data", str(files / "train.csv"), "--by", "rows",
                        "--order", "time", "--train", str(tr), "--test", str(te)], capsys)
    a, b = pd.read_csv(tr), pd.read_csv(te)
    assert code == 0 and set(b.user) <= set(a.user)
    assert (b.groupby("user").timestamp.min() >= a.groupby("user").timestamp.max()
            .reindex(b.user.unique())).all()


def test_benchmark_runs_a_script_job(tmp_path, capsys):
    """`fedcf benchmark movielens` is the script's job with the same flags: the same rows and
    figures as calling the script directly, and a flag that changes the job changes them."""
    from conftest import load_script

    flags = ["--dataset", "synthetic", "--quick", "--no-progress"]
    out = tmp_path / "rows.json"
    code = main(["benchmark", "movielens", *flags, "--json", str(out)])
    capsys.readouterr()
    via_cli = json.loads(out.read_text())
    load_script("movielens_benchmark").main([*flags, "--json", str(tmp_path / "d.json")])
    capsys.readouterr()
    assert code == 0 and len(via_cli) == 14

    def figures(rows):
        return [(r["name"], r["protocol"], r["rmse"], r["accuracy"], r["n_ratings"]) for r in rows]
    assert figures(via_cli) == figures(json.loads((tmp_path / "d.json").read_text()))
    other = tmp_path / "seed1.json"
    main(["benchmark", "movielens", *flags, "--seed", "1", "--json", str(other)])
    capsys.readouterr()
    assert figures(json.loads(other.read_text())) != figures(via_cli)


def test_console_script_and_module_entry_points():
    for cmd in (["fedcf", "--version"], [sys.executable, "-m", "fedcf", "--version"]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and res.stdout.startswith("fedcf "), res.stderr
    res = subprocess.run([sys.executable, "-m", "fedcf", "recommend", "--model", "none.npz",
                          "--items", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    helps = ["train", "evaluate", "recommend", "benchmark", "data", "plot"]
    for sub in helps:
        res = subprocess.run([sys.executable, "-m", "fedcf", sub, "--help"], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0 and "usage: fedcf " + sub in res.stdout


def test_new_user_recommendation_is_deterministic(bad_setup, capsys):
    _, model = bad_setup
    argv = ["recommend", "--model", str(model), "--items", "1", "2", "--ratings", "5", "3",
            "--json"]
    first = run(argv, capsys)[1]
    assert first == run(argv, capsys)[1]
    assert np.isfinite([r["score"] for r in json.loads(first)]).all()


def test_a_first_run_says_it_compiles_and_a_later_one_does_not(files, capsys, tmp_path,
                                                                monkeypatch):
    """With the model's kernels not yet marked compiled, train says what the wait is and how
    to avoid it; after the fit the path is marked, so the next run is silent about it."""
    from fedcf import warmup

    marked = set()
    monkeypatch.setattr(warmup, "is_compiled", lambda path: path in marked)
    monkeypatch.setattr(warmup, "_mark", marked.add)
    argv = ["train", "--data", str(files / "train.csv"), "--model", "fedrecon", "--out",
            str(tmp_path / "m.npz"), "--rounds", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note: compiling fedcf's kernels" in err and "fedcf compile --paths fedrecon-als" in err
    assert marked == {"fedrecon-als"}
    assert main(argv) == 0
    assert "compiling" not in capsys.readouterr().err


def test_an_interrupt_during_an_import_is_not_turned_into_another_error(monkeypatch, capsys):
    """Ctrl-C that lands inside an import (pandas, say) leaves that import half done; the
    handler must report the interrupt (130) without importing anything (it once evaluated the
    list of input errors first, which imports fedcf.datasets, and crashed with exit 1)."""
    from fedcf.cli import app, common

    def interrupted(args):
        raise KeyboardInterrupt

    def broken_import():
        raise AttributeError("partially initialized module 'pandas' has no attribute 'plotting'")
    monkeypatch.setattr(app._module("train"), "cmd_train", interrupted)
    monkeypatch.setattr(app, "user_errors", broken_import)
    monkeypatch.setattr(common, "user_errors", broken_import)
    code = app.main(["train", "--data", "x.csv", "--model", "fedrecon", "--out", "m.npz"])
    assert code == 130 and "interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(files, tmp_path, delay):
    """Ctrl-C while the libraries load (before: a long traceback and exit -2) or while the
    command runs: exit code 130, the interrupt named on the last line, no model file. (An
    interrupt that lands in Numba's compiler callback is printed by llvmlite as "ignored" and
    lost; fedcf's handler then interrupts again a few seconds later.)"""
    import signal
    import time

    out = tmp_path / "m.npz"
    proc = subprocess.Popen([sys.executable, "-m", "fedcf", "train", "--data",
                             str(files / "train.csv"), "--model", "fedrecon", "--out", str(out),
                             "--rounds", "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err.strip().splitlines()[-1]
    assert err.count("Traceback") <= err.count("Exception ignored"), err
    assert not out.exists()


def test_an_interrupt_wrapped_by_a_library_import_is_still_an_interrupt(monkeypatch, capsys):
    """Ctrl-C while a library defines a class reaches main as "RuntimeError: Error calling
    __set_name__" caused by the KeyboardInterrupt (seen once under load in the test above):
    still exit code 130 and one line. Any other error is not swallowed."""
    from fedcf.cli import app, interrupted, main

    def wrapped(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc

    monkeypatch.setattr(app, "main", wrapped)
    assert main(["train"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("fedcf: interrupted")
    assert not interrupted(RuntimeError("a plain failure"))

    def failing(args):
        raise RuntimeError("a plain failure")

    monkeypatch.setattr(app, "main", failing)
    with pytest.raises(RuntimeError, match="a plain failure"):
        main(["train"])


@pytest.mark.parametrize("command", ["", "train", "evaluate", "recommend", "benchmark",
                                     "compile", "plot"])
def test_help_loads_nothing_heavy(command):
    """`fedcf --help` and a command's --help build only that command's parser: no numba,
    scikit-learn or pandas (numpy only for train, whose parser lists the estimators)."""
    code = ("import sys\nfrom fedcf.cli import main\ntry:\n    main([*sys.argv[1:], '--help'])\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('numpy', 'numba', 'sklearn', "
            "'pandas') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code, *[c for c in [command] if c]],
                         capture_output=True, text=True, timeout=60)
    assert "usage: fedcf" in res.stdout, res.stderr
    assert res.stdout.splitlines()[-1] == "[]", res.stdout[-300:]
    if command == "train":
        assert "fedrecon-implicit" in res.stdout  # the estimators are listed, not loaded


def test_registry_names_the_estimators_classes():
    from fedcf import registry
    from fedcf._registry import ESTIMATORS

    assert registry.names("estimator") == sorted(ESTIMATORS)
    for name, cls in ESTIMATORS.items():
        assert registry.lookup("estimator", name) is cls


def test_version_and_import_load_nothing_heavy():
    code = ("import sys, fedcf; from fedcf.cli import main; main(['--version']); "
            "print(sorted(m for m in ('numpy', 'numba', 'sklearn', 'pandas') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("fedcf ") and lines[1] == "[]", res.stderr


def test_ctrl_c_on_a_benchmark_script_is_one_line_and_exit_130(tmp_path):
    """The main job (scripts/movielens_benchmark.py) interrupted while it runs: exit code 130,
    one line naming the interrupt, no traceback, no result file."""
    import signal
    import time

    out = tmp_path / "r.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "movielens_benchmark.py"
    # the script's imports first, then "ready", then the script: the interrupt lands in its
    # job, not in an import still running on a busy machine
    start = ("import runpy, sys, numpy, pandas, sklearn.model_selection, fedcf.eval, "
             "fedcf.datasets; print('ready', flush=True); "
             f"sys.argv = [{str(script)!r}, '--json', {str(out)!r}, '--no-progress']; "
             f"runpy.run_path({str(script)!r}, run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(3.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == \
        "movielens_benchmark.py: interrupted; no result file was left half-written"
    assert err.count("Traceback") <= err.count("Exception ignored"), err
    assert not out.exists()
