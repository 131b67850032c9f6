"""minGRU-family recurrent layers and a small language model built from them.

Every recurrent layer maps ``(B, T, dim) -> (B, T, dim)``, returns ``(y, final_state)`` from ``forward``,
has an O(1) ``step`` equal to the parallel forward and keeps its state in float32 whatever the input dtype.
"""

from mingru.layers.angle import MinGRUAngle
from mingru.layers.diag import MinGRUDiag
from mingru.layers.lm import MinGRULM
from mingru.layers.matrix import MinGRUMatrix
from mingru.layers.mingru import MinGRU
from mingru.layers.minlstm import MinLSTM

__all__ = ["MinGRU", "MinGRUAngle", "MinGRUDiag", "MinGRULM", "MinGRUMatrix", "MinLSTM"]
