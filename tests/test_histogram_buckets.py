"""histogram_buckets: every duration histogram uses the configured bounds, and /metrics shows only those."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import config, runtime
from otel_torchdist import names as n
from otel_torchdist.export.prometheus import families

BOUNDS = (0.001, 0.1, 10.0)


def test_every_duration_histogram_takes_the_configured_bounds(fake_pg, instrumented):
    instrumented(histogram_buckets=list(BOUNDS), system_interval=0.05)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(4))], lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    for i in range(3):
        with otel_torchdist.step(i + 1):
            for (x,) in loader:
                dist.all_reduce(x)
            opt.step()
    otel_torchdist.flush(5)
    data = runtime.current().pipeline.metric_data()
    histograms = {md.metric.name: md.points for md in data if md.metric.instrument == "histogram" and md.points}
    assert {
        n.COLLECTIVE_DURATION.name,
        n.STEP_DURATION_METRIC.name,
        n.OPTIMIZER_STEP_DURATION.name,
        n.DATALOADER_WAIT.name,
    } <= set(histograms)
    for name, points in histograms.items():
        for p in points:
            assert p.bounds == BOUNDS and len(p.bucket_counts) == len(BOUNDS) + 1, name
            assert sum(p.bucket_counts) == p.count > 0, name
    (collective,) = histograms[n.COLLECTIVE_DURATION.name]
    assert collective.count == 6
    samples = [s for fam in families(data) if fam.name == "torchdist_collective_duration_seconds" for s in fam.samples]
    assert sorted({s.labels["le"] for s in samples if s.name.endswith("_bucket")}) == ["+Inf", "0.001", "0.1", "10.0"]


@pytest.mark.parametrize(
    "value, reason",
    [((), "non-empty"), ((0.1, 0.01), "strictly increasing"), ((0.0, 1.0), "> 0"), ("0.1,1", "list of seconds")],
)
def test_bad_bounds_are_refused_by_name(value, reason):
    with pytest.raises(ValueError, match=f"histogram_buckets: .*{reason}"):
        config.load({"histogram_buckets": value}, environ={})


def test_bounds_from_the_environment():
    cfg = config.load({}, environ={"OTEL_TORCHDIST_HISTOGRAM_BUCKETS": "0.001, 0.01,1"})
    assert cfg.histogram_buckets == (0.001, 0.01, 1.0)
    with pytest.raises(ValueError, match="OTEL_TORCHDIST_HISTOGRAM_BUCKETS='1,0.5': must be strictly increasing"):
        config.load({}, environ={"OTEL_TORCHDIST_HISTOGRAM_BUCKETS": "1,0.5"})
