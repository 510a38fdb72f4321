"""A job's ranks side by side: the slowest rank named with the cause its numbers show."""

from engine.analyse.metrics import BatchRecord
from engine.analyse.ranks import RankFigures, rank_figures, slowest_rank


def test_a_starved_rank_is_named_with_its_input_wait():
    ranks = [RankFigures(0, 0, 1000.0, 0.05, 10.0), RankFigures(1, 0, 990.0, 0.06, 10.0),
             RankFigures(2, 1, 600.0, 0.45, 10.0), RankFigures(3, 1, 1010.0, 0.04, 10.0)]
    rank, why = slowest_rank(ranks)
    assert rank == 2 and "starved" in why and "45%" in why and "node 1" in why


def test_a_rank_with_slow_steps_is_named_for_its_steps():
    ranks = [RankFigures(0, 0, 1000.0, 0.05, 10.0), RankFigures(1, 0, 700.0, 0.05, 14.5)]
    rank, why = slowest_rank(ranks)
    assert rank == 1 and "steps are slower" in why and "14.5 ms" in why


def test_ranks_within_the_noise_name_nobody():
    assert slowest_rank([RankFigures(0, 0, 1000.0, 0.1, 10), RankFigures(1, 0, 970.0, 0.1, 10)]
                        ) is None
    assert slowest_rank([RankFigures(0, 0, 1000.0, 0.1, 10)]) is None


def test_figures_come_from_a_rank_s_batches():
    batches = [BatchRecord(i, 0, i * 0.010, 0.002, 0.008, 32, None, -1, 1, i * 0.010, 0.0, 0.0)
               for i in range(50)]
    figures = rank_figures(3, 1, batches)
    assert figures.rank == 3 and abs(figures.samples_per_s - 3200) < 50
    assert abs(figures.input_wait_frac - 0.2) < 0.02 and abs(figures.step_ms - 8.0) < 0.01
