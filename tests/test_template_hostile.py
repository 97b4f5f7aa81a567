"""Hostile chat templates: each stops with a clear error inside its budget, and no code runs."""

from __future__ import annotations

import pytest

from tallow.runtime.errors import TemplateError
from tallow.runtime.template import ChatTemplate

MESSAGES = [{"role": "user", "content": "hi"}]


def hostile(marker) -> dict[str, str]:
    touch = f"touch {marker}"
    return {
        "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "cycler globals": "{{ cycler.__init__.__globals__.os.system('" + touch + "') }}",
        "lipsum globals": "{{ lipsum.__globals__['os'].system('" + touch + "') }}",
        "joiner globals": "{{ joiner.__init__.__globals__['__builtins__']['__import__']('os').system('" + touch + "') }}",
        "format escape": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
        "huge range": "{% for i in range(10**9) %}{% endfor %}",
        "nested loops": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "loops over messages": "{% for a in range(99999) %}{% for m in messages * 99999 %}{% endfor %}{% endfor %}",
        "recursive macro": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "mutual recursion": "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
        "string repeat": "{{ ('x' * 1000000000)|length }}",
        "list repeat": "{{ ([1] * 100000000)|length }}",
        "power": "{{ 2 ** 1000000 }}",
        "center filter": "{{ 'x'|center(1000000000)|length }}",
        "str method": "{{ 'x'.ljust(1000000000)|length }}",
        "printf width": "{{ ('%0999999999d' % 1)|length }}",
        "printf star": "{{ ('%*d' % (999999999, 1))|length }}",
        "output flood": "{% for a in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
    }


@pytest.mark.parametrize("name", sorted(hostile("/x")))
def test_hostile_template_is_refused_and_runs_nothing(name, tmp_path):
    marker = tmp_path / "pwned"
    source = hostile(marker)[name]
    template = ChatTemplate(source, "", "")
    with pytest.raises(TemplateError, match="unsafe or too expensive chat template") as err:
        template.render(MESSAGES)
    assert "\n" not in err.value.message and err.value.hint
    assert not marker.exists()


def test_ordinary_templates_still_render():
    source = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
              "{{ 'ab'|center(6) }}{{ '%5d' % 3 }}{% for i in range(3) %}{{ i }}{% endfor %}{{ 2 ** 10 }}")
    out = ChatTemplate(source, "<s>", "</s>").render(MESSAGES)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n  ab      3012" + "1024"


def test_the_budget_is_per_render():
    # A template that uses most of the step budget renders again and again.
    source = "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}ok"
    template = ChatTemplate(source, "", "")
    assert [template.render(MESSAGES) for _ in range(3)] == ["ok"] * 3
