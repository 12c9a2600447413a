"""Plugin module (DSV4BENCH_PLUGINS=planted_family): registers the planted-bug kernel family."""

from planted_kernels import PlantedFamily, PlantedImpl

from dsv4bench.core.registry import register_family, register_impl

register_family(PlantedFamily())
register_impl(PlantedImpl())
