"""pytorchexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfilter import individual_filter_mod
from pytorchexample.task import Net, load_data
from pytorchexample.task import test as test_fn
from pytorchexample.task import train as train_fn

# Flower ClientApp
app = ClientApp(mods=[individual_filter_mod])


def _model(msg: Message):
    """The global model sent by the server, on this node's device."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return model.to(device), device


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""
    model, device = _model(msg)
    trainloader, _ = load_data(
        context.node_config["partition-id"], context.node_config["num-partitions"], context.run_config["batch-size"]
    )
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], device)

    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""
    model, device = _model(msg)
    _, valloader = load_data(
        context.node_config["partition-id"], context.node_config["num-partitions"], context.run_config["batch-size"]
    )
    eval_loss, eval_acc = test_fn(model, valloader, device)

    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
