import os

import pytest
from torch.utils.data import Dataset

from dataloader_tuner.errors import TargetError
from dataloader_tuner.child.target import resolve, split_target

from .conftest import EXAMPLES, dataset_path


def test_split_target_forms():
    assert split_target("a/b.py:make") == ("a/b.py", "make")
    assert split_target("pkg.mod:attr") == ("pkg.mod", "attr")
    assert split_target("pkg.mod") == ("pkg.mod", None)
    assert split_target("C:/data/x.py") == ("C:/data/x.py", None)


def test_instance_attribute_with_module_extras():
    resolved = resolve(dataset_path("small_map.py") + ":dataset")
    assert isinstance(resolved.dataset, Dataset) and len(resolved.dataset) == 64
    assert resolved.batch_size == 4 and resolved.train_step is None


def test_class_and_factory_attributes():
    assert len(resolve(dataset_path("small_map.py") + ":SmallMap").dataset) == 64
    assert resolve(os.path.join(EXAMPLES, "cpu_bound.py") + ":make_dataset").found_as == "make_dataset"


def test_default_names_are_tried_in_order():
    assert resolve(dataset_path("small_map.py")).found_as == "dataset"
    assert resolve(dataset_path("stream.py")).found_as == "get_dataset"
    assert resolve(dataset_path("with_step.py")).found_as == "make_dataset"
    assert resolve(dataset_path("with_step.py")).train_step is not None


def test_single_dataset_subclass_is_found():
    resolved = resolve(dataset_path("one_class.py"))
    assert resolved.found_as == "OnlyOne"


def test_dotted_module_target():
    resolved = resolve("tests.datasets.small_map:SmallMap")
    assert len(resolved.dataset) == 64


def test_iterable_dataset_is_recognised():
    assert resolve(dataset_path("stream.py")).is_iterable


@pytest.mark.parametrize(
    "target, kind, phrase",
    [
        ("nope/missing.py", "target_not_found", "Dataset file not found"),
        ("no_such_pkg.mod", "target_not_found", "Module not found: no_such_pkg.mod"),
        ("syntax_error.py", "target_syntax_error", "line 3"),
        ("missing_import.py", "target_import_error", "definitely_not_installed_pkg"),
        ("nothing_here.py", "target_no_dataset", "tried make_dataset, get_dataset, dataset"),
        ("two_classes.py", "target_ambiguous", "A, B"),
        ("factory_raises.py", "target_factory_error", "FileNotFoundError: /data/train.csv"),
        ("needs_args.py", "target_factory_error", "needs arguments"),
        ("returns_generator.py", "target_not_dataset", "returned a generator"),
        ("small_map.py:SmallMap(rows=open(1))", "target_bad_arguments", "open(1) is not a literal"),
        ("small_map.py:nope", "target_attr_missing", "has no attribute 'nope'"),
    ],
)
def test_bad_targets_have_a_specific_headline(target, kind, phrase):
    if target.endswith(".py") or ".py:" in target:
        target = dataset_path(target) if not target.startswith("nope/") else target
    with pytest.raises(TargetError) as caught:
        resolve(target)
    assert caught.value.type == kind
    assert phrase in caught.value.message
    assert "\n" not in caught.value.message  # a one-line headline; tracebacks go in details


def test_duck_typed_dataset_and_dataset_factories_are_accepted():
    """DataLoader's own rule: anything with __getitem__ and __len__ is map-style."""
    resolved = resolve(dataset_path("duck_table.py"))
    assert not isinstance(resolved.dataset, Dataset) and not resolved.is_iterable
    assert resolved.sampler is not None  # make_sampler(dataset) was called with the dataset
    assert resolved.expressions["sampler"] == "make_sampler(dataset)"
    assert resolve(dataset_path("returns_list.py")).dataset == [1, 2, 3]


def test_factory_with_literal_arguments():
    resolved = resolve(dataset_path("duck_table.py") + ':make_dataset(rows=12)')
    assert len(resolved.dataset) == 12 and resolved.found_as == "make_dataset(rows=12)"
    assert split_target("C:/d/x.py:make(root='a:b')") == ("C:/d/x.py", "make(root='a:b')")
    needs = resolve(dataset_path("needs_args.py") + ':NeedsPath("/data")')
    assert needs.dataset.root == "/data"


def test_refusals_name_the_full_type():
    with pytest.raises(TargetError) as caught:
        resolve(dataset_path("returns_generator.py"))
    assert "IterableDataset" in caught.value.message and "\n" not in caught.value.message
