"""The training loops people write with frameworks, run for real in gloo ranks: Lightning, Accelerate,
Hugging Face's Trainer, and a torchtitan-style loop. Each trains a small model with gradient accumulation
(2 micro-batches per optimizer step), instrumented with every step traced, and returns what it did."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn

import otel_torchdist

from .scenarios_training import _instrument as _instrument_traced

ACCUMULATE = 2
OPTIMIZER_STEPS = 4
BATCH = 8


def _instrument(out: str, run_id: str) -> None:
    _instrument_traced(out, run_id, straggler_exchange_steps=0)  # every step traced, to the run folder


def _data(rank: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(rank)
    n = BATCH * ACCUMULATE * OPTIMIZER_STEPS
    return torch.utils.data.TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g))


def lightning(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, _index):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, sync_dist=True)  # an all-reduce inside the closure
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    _instrument(out, "lightning")
    trainer = L.Trainer(
        accelerator="cpu", devices=ws, strategy="ddp", accumulate_grad_batches=ACCUMULATE, max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_data(rank), batch_size=BATCH)
    trainer.fit(Model(), loader)
    steps = trainer.global_step
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"optimizer_steps": steps}


def accelerate(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    from accelerate import Accelerator

    _instrument(out, "accelerate")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(_data(0), batch_size=BATCH)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    steps = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            steps += int(accelerator.sync_gradients)
    otel_torchdist.uninstrument()
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"optimizer_steps": steps}


def hf_trainer(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    from transformers import Trainer, TrainingArguments

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def forward(self, x, labels=None):
            pred = self.net(x)
            return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}

    class Rows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.data = _data(0)

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i):
            x, y = self.data[i]
            return {"x": x, "labels": y}

    _instrument(out, "hf-trainer")
    training = TrainingArguments(
        output_dir=os.path.join(out, f"hf-rank{rank}"), per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE, max_steps=OPTIMIZER_STEPS, use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=Model(), args=training, train_dataset=Rows())
    trainer.train()
    steps = trainer.state.global_step
    otel_torchdist.uninstrument()
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"optimizer_steps": steps}


def titan_style(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """torchtitan's shape: FSDP2 on each block and the root, explicit steps numbered from 1, gradient
    accumulation inside a train_step, clipping with a global norm (an all-reduce), a logging all-reduce."""
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, "titan")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = _data(rank)

    def train_step(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros(())
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y) / len(batches)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)  # the logged loss, averaged over the ranks
        return total

    for step in range(1, OPTIMIZER_STEPS + 1):
        with otel_torchdist.step(step):
            start = (step - 1) * BATCH * ACCUMULATE
            batches = [data[start + i * BATCH : start + (i + 1) * BATCH] for i in range(ACCUMULATE)]
            train_step(batches)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"optimizer_steps": OPTIMIZER_STEPS}


def accelerate_epochs(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Accelerate without accumulation over two epochs: its DataLoaderShard fetches a batch ahead, so an
    epoch's last batch is handed out without a fetch; the training loader shuffles (a new epoch's first
    hand-out broadcasts the RNG state), and an evaluation over the training set, sequential, follows each
    epoch (a gather a batch)."""
    from accelerate import Accelerator

    _instrument(out, "accelerate-epochs")
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = _data(0)
    train = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    evaluation = torch.utils.data.DataLoader(data, batch_size=BATCH)
    model, opt, loader, evaluation = accelerator.prepare(model, opt, train, evaluation)
    steps = 0
    for _ in range(2):
        for x, y in loader:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            steps += 1
        with torch.no_grad():
            for x, _y in evaluation:
                accelerator.gather(model(x))
    otel_torchdist.uninstrument()
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"optimizer_steps": steps}
