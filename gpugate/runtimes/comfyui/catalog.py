"""ComfyUI's node definitions as its `GET /object_info` describes them, parsed into typed classes.

Pure: a decoded JSON answer in, a `Catalog` out, never an exception. A class whose entry has
a shape this module does not read is kept (it exists, for the "does not exist" check) but
marked `by_code`, so that validation never decides about it.

Which classes `validate` cannot decide from the catalog alone (`NodeSpec.by_code`):

- classes of custom node packs (`python_module` not ComfyUI's own): they may define
  `VALIDATE_INPUTS`, which skips checks and adds its own, and type strings whose `__ne__`
  matches more than the text says;
- ComfyUI 0.3.64's own classes with a validation function the gate does not copy
  (`CODE_VALIDATED`); those whose function is a file check (the LoadImage family,
  `FILE_CHECKS`) the gate runs itself;
- entries whose inputs are not `[type]` or `[type, {options}]`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

CORE_MODULES = ("nodes", "comfy_extras.", "comfy_api_nodes.")
"""`python_module` of classes ComfyUI ships (`nodes.load_custom_node`'s `module_parent`)."""

CODE_VALIDATED = frozenset(
    {
        "FluxProUltraImageNode",  # comfy_api_nodes/nodes_bfl.py:205
        "KlingCameraControls",  # comfy_api_nodes/nodes_kling.py:711
        "TripoConversionNode",  # comfy_api_nodes/nodes_tripo.py:524
        "LoadImageSetNode",  # comfy_extras/nodes_train.py:214 (a list of names)
    }
)  # fmt: skip
"""ComfyUI 0.3.64's own classes with `VALIDATE_INPUTS` / `validate_inputs` whose code the
gate does not copy: only ComfyUI can tell."""


@attrs.frozen
class FileCheck:
    """A class whose VALIDATE_INPUTS is `folder_paths.exists_annotated_filepath(name)`: the
    named input's value must name a file ComfyUI has (input folder unless annotated)."""

    module: str
    """The class's `python_module`: a pack that replaces the class is not this check."""
    input: str
    message: str
    """What the function returns when the file is not there, `{}` the name."""
    function: str
    """The function's qualified name, as Python's TypeError names it."""


FILE_CHECKS = {
    "LoadImage": FileCheck("nodes", "image", "Invalid image file: {}", "LoadImage.VALIDATE_INPUTS"),
    "LoadImageMask": FileCheck(
        "nodes", "image", "Invalid image file: {}", "LoadImageMask.VALIDATE_INPUTS"
    ),
    # It inherits LoadImage's function, which looks in the input folder unless annotated.
    "LoadImageOutput": FileCheck(
        "nodes", "image", "Invalid image file: {}", "LoadImage.VALIDATE_INPUTS"
    ),
    "LoadLatent": FileCheck(
        "nodes", "latent", "Invalid latent file: {}", "LoadLatent.VALIDATE_INPUTS"
    ),
    "LoadAudio": FileCheck(
        "comfy_extras.nodes_audio", "audio", "Invalid audio file: {}", "LoadAudio.VALIDATE_INPUTS"
    ),
    "LoadVideo": FileCheck(
        "comfy_extras.nodes_video", "file", "Invalid video file: {}", "LoadVideo.validate_inputs"
    ),
}
"""nodes.py:537 (LoadLatent), 1700 (LoadImage, and LoadImageOutput by inheritance), 1749
(LoadImageMask); comfy_extras/nodes_audio.py:346; comfy_extras/nodes_video.py:199."""

CONVERTED = ("INT", "FLOAT", "STRING", "BOOLEAN")
"""Types whose literal values ComfyUI converts with int(), float(), str(), bool()."""


class Category(enum.Enum):
    """Where INPUT_TYPES declares an input."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    HIDDEN = "hidden"


class InputKind(enum.Enum):
    """How ComfyUI's `validate_inputs` treats a literal value of the input."""

    INT = "INT"
    FLOAT = "FLOAT"
    STRING = "STRING"
    BOOLEAN = "BOOLEAN"
    LIST = "list"
    """Declared as a list of values: a literal must be `in` it (value_not_in_list)."""
    OTHER = "other"
    """Any other type name: a link type, `*`, or `COMBO` with options (values unchecked)."""


@attrs.frozen(eq=False)
class InputSpec:
    """One input of a node class, as INPUT_TYPES declares it."""

    name: str
    category: Category
    kind: InputKind
    type_name: str = ""
    """The declared type; empty for a LIST input."""
    choices: tuple[Any, ...] = ()
    """The values of a LIST input, or the `options` of a `COMBO` input (which go unchecked)."""
    options: Mapping[str, Any] = attrs.field(factory=dict)
    """The declaration's second element, verbatim: errors echo it as `input_config`."""
    input_type: Any = attrs.field(init=False, repr=False)
    """The first element of the declaration, as ComfyUI compares it: made once, for every
    prompt validated against this catalog compares its inputs with it. Read only; what a
    refusal echoes is `config`'s copy."""

    def __attrs_post_init__(self) -> None:
        kind = self.type_name if self.kind is not InputKind.LIST else list(self.choices)
        object.__setattr__(self, "input_type", kind)

    @property
    def config(self) -> list[Any]:
        """`input_config`: `(input_type, extra_info)`, extra_info `{}` when not declared;
        new lists and dicts each time, as ComfyUI echoes them in a refusal."""
        kind = list(self.choices) if self.kind is InputKind.LIST else self.type_name
        return [kind, dict(self.options)]

    @property
    def minimum(self) -> Any | None:
        return self.options.get("min")

    @property
    def maximum(self) -> Any | None:
        return self.options.get("max")


@attrs.frozen(eq=False)
class NodeSpec:
    """One node class: its inputs, its outputs (RETURN_TYPES) and whether it is an output."""

    name: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[Any, ...]
    """RETURN_TYPES: type names, or value tuples for outputs that are lists of values."""
    output_node: bool
    python_module: str = ""
    by_code: bool = False
    """Validation of this class runs code the catalog cannot describe."""
    file_check: FileCheck | None = None
    """Its validation code is a file check the gate runs itself."""
    validated_inputs: tuple[InputSpec, ...] = attrs.field(init=False, repr=False)
    """Required then optional inputs: those `validate_inputs` looks at (hidden never).
    Picked once, as every prompt naming the class walks them."""

    def __attrs_post_init__(self) -> None:
        shown = tuple(i for i in self.inputs if i.category is not Category.HIDDEN)
        object.__setattr__(self, "validated_inputs", shown)

    def input(self, name: str) -> InputSpec | None:
        return next((i for i in self.validated_inputs if i.name == name), None)


@attrs.frozen(eq=False)
class Catalog:
    """Every node class a ComfyUI knows, by class name."""

    nodes: Mapping[str, NodeSpec] = attrs.field(factory=dict)

    def get(self, class_type: Any) -> NodeSpec | None:
        """The class named so; None when ComfyUI does not know it. Raises if unhashable."""
        return self.nodes.get(class_type)

    @property
    def custom_modules(self) -> frozenset[str]:
        """Custom node packs' modules: code that may also rewrite prompts before validation.

        A pack can register a prompt handler (`PromptServer.add_on_prompt_handler`) or replace
        ComfyUI's validation; the catalog cannot show either. An operator who knows a pack
        does so can turn the gate's validation off for that runtime.
        """
        modules = (n.python_module for n in self.nodes.values())
        return frozenset(m for m in modules if m and not _core(m))

    def refreshed(self, asked: Iterable[str], answer: Catalog) -> Catalog:
        """This catalog with `asked` classes replaced by a fresh `/object_info/{class}` answer.

        A class asked for but absent from the answer is gone (ComfyUI answers `{}` for it).
        """
        gone = set(asked)
        nodes = {k: v for k, v in self.nodes.items() if k not in gone}
        nodes.update(answer.nodes)
        return Catalog(nodes)


def _core(module: str) -> bool:
    return module == CORE_MODULES[0] or module.startswith(CORE_MODULES[1:])


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _input(name: str, category: Category, declared: Any) -> InputSpec | None:
    """An input from `[type]` / `[type, {options}]`; None for shapes validation cannot read."""
    if not isinstance(declared, list) or not declared:
        return None
    head = declared[0]
    options: Any = declared[1] if len(declared) > 1 else {}
    if not isinstance(options, dict):
        # ComfyUI asserts extra_info is not None; other shapes fail in ways not worth copying.
        return None
    if isinstance(head, list):
        return InputSpec(name, category, InputKind.LIST, choices=tuple(head), options=options)
    if not isinstance(head, str):
        return None
    kind = InputKind(head) if head in CONVERTED else InputKind.OTHER
    choices = options.get("options") if head == "COMBO" else None
    return InputSpec(
        name,
        category,
        kind,
        type_name=head,
        choices=tuple(choices) if isinstance(choices, list) else (),
        options=options,
    )


def _node(name: str, info: Any) -> NodeSpec:
    if not isinstance(info, dict):
        return NodeSpec(name, (), (), False, by_code=True)
    module = info.get("python_module")
    module = module if isinstance(module, str) else ""
    by_code = name in CODE_VALIDATED or not _core(module)
    file_check = FILE_CHECKS.get(name)
    if file_check is not None and file_check.module != module:
        file_check = None
        by_code = True
    # ComfyUI's validate_prompt asks `OUTPUT_NODE is True`; node_info writes True only then
    # for every class ComfyUI ships.
    output_node = info.get("output_node") is True
    outputs_raw = info.get("output")
    outputs = tuple(_frozen(o) for o in outputs_raw) if isinstance(outputs_raw, list) else ()
    if not isinstance(outputs_raw, list):
        by_code = True
    inputs: list[InputSpec] = []
    declared = info.get("input")
    if not isinstance(declared, dict):
        return NodeSpec(name, (), outputs, output_node, module, by_code=True)
    seen: set[str] = set()
    for category in Category:
        group = declared.get(category.value, {})
        if not isinstance(group, dict):
            by_code = True
            continue
        for input_name, spec in group.items():
            if category is Category.HIDDEN:
                # Hidden inputs are never validated; they may be bare strings ("PROMPT").
                inputs.append(InputSpec(input_name, category, InputKind.OTHER))
                continue
            if input_name in seen:
                # get_input_info looks in "required" first: a name in both is required.
                continue
            seen.add(input_name)
            parsed = _input(input_name, category, spec)
            if parsed is None:
                by_code = True
                continue
            inputs.append(parsed)
    if file_check is not None and all(i.name != file_check.input for i in inputs):
        by_code = True
    return NodeSpec(name, tuple(inputs), outputs, output_node, module, by_code, file_check)


def parse_object_info(answer: Any) -> Catalog:
    """A catalog from a decoded `GET /object_info` (or `/object_info/{class}`) answer."""
    if not isinstance(answer, dict):
        return Catalog()
    return Catalog({str(name): _node(str(name), info) for name, info in answer.items()})
