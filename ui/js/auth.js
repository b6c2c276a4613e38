// The identity routes the panel uses (scrinalia/api, issue #5).
export const AUTH = {
  login: '/auth/login',
  logout: '/auth/logout',
  me: '/auth/me',
  password: '/auth/change-password',
};
