//! Kubernetes quantities (`500m`, `1Gi`) compared by value.

/// A Kubernetes quantity as an exact number: `mantissa × 10^exp10 × 2^exp2`,
/// the mantissa stripped of trailing zeros. No floats: `0.1 + 0.2` style
/// errors would make equal requests look like drift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Quantity {
    pub(super) mantissa: i128,
    pub(super) exp10: i32,
    pub(super) exp2: u32,
}

impl Quantity {
    /// `<sign><digits>[.<digits>]<suffix>`, the suffix one of the decimal SI
    /// `n u m k M G T P E`, the binary `Ki … Ei`, or an exponent `e3`/`E-3`.
    /// None when it is not a quantity or too large to hold exactly.
    pub(super) fn parse(text: &str) -> Option<Quantity> {
        let bytes = text.as_bytes();
        let (negative, mut at) = match bytes.first() {
            Some(b'-') => (true, 1),
            Some(b'+') => (false, 1),
            _ => (false, 0),
        };
        let (mut mantissa, mut exp10, mut digits, mut seen_dot) = (0i128, 0i32, 0usize, false);
        while let Some(&byte) = bytes.get(at) {
            match byte {
                b'0'..=b'9' => {
                    mantissa = mantissa
                        .checked_mul(10)?
                        .checked_add(i128::from(byte - b'0'))?;
                    if seen_dot {
                        exp10 -= 1;
                    }
                    digits += 1;
                }
                b'.' if !seen_dot => seen_dot = true,
                _ => break,
            }
            at += 1;
        }
        if digits == 0 {
            return None;
        }
        let (suffix10, exp2) = match &text[at..] {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            other => {
                let exponent: i32 = other.strip_prefix(['e', 'E'])?.parse().ok()?;
                if exponent.abs() > 1000 {
                    return None;
                }
                (exponent, 0)
            }
        };
        exp10 += suffix10;
        if mantissa == 0 {
            return Some(Quantity {
                mantissa: 0,
                exp10: 0,
                exp2: 0,
            });
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp10 += 1;
        }
        if negative {
            mantissa = -mantissa;
        }
        Some(Quantity {
            mantissa,
            exp10,
            exp2,
        })
    }

    pub(super) fn same_value(self, other: Quantity) -> bool {
        if self.exp2 == other.exp2 || self.mantissa == 0 || other.mantissa == 0 {
            // Decimal forms are canonical once trailing zeros are stripped.
            return self.mantissa == other.mantissa
                && (self.mantissa == 0 || (self.exp10 == other.exp10 && self.exp2 == other.exp2));
        }
        let base = self.exp10.min(other.exp10);
        match (
            self.scaled(self.exp10 - base),
            other.scaled(other.exp10 - base),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    fn scaled(self, shift10: i32) -> Option<i128> {
        let p10 = 10i128.checked_pow(u32::try_from(shift10).ok()?)?;
        let p2 = 2i128.checked_pow(self.exp2)?;
        self.mantissa.checked_mul(p10)?.checked_mul(p2)
    }
}
